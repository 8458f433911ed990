/* bench_kv.c — the key-value store (nvh_kv_*) vs LMDB and RocksDB, db_bench-style workloads
 *
 * Cases (docs/BENCHMARKS.md, section "kv"), each "WORKLOAD/VALUE-THREADS",
 * e.g. "fillrandom/100B-1t"; N keys of 16 random bytes (--keys, default
 * 1 000 000), values of 100 B and 1 KiB (--values), 1 and 2 threads
 * (--threads); the threads split the operations between them:
 *   fillseq       N puts in key order into an empty store
 *   fillrandom    N puts in random order into an empty store
 *   overwrite     N puts of the same keys, new values, random order
 *   readrandom    N gets of present keys, random order (the value is read)
 *   readmissing   N gets of absent keys
 *   readseq       one full scan (1 thread only), reading every value;
 *                 reported per entry
 *   seekrandom    N/10 seeks to a random present key, then 100 nexts
 *                 (sorted stores only), reported per seek
 *   deleterandom  N removes, random order, until the store is empty
 * Every write is durable when it returns, in every subject:
 *   nvheap-sorted, nvheap-hash   nvh_kv_put/get/remove (engine "sorted",
 *                 "hash") on a pool in the pmem domain on --dir (default
 *                 /dev/shm: CLWB + SFENCE), created with NVH_POOL_PREFAULT;
 *                 readseq is nvh_kv_get_all, seekrandom nvh_kv_get_above
 *                 with a callback that stops after 101 entries
 *   lmdb          one write transaction per put/delete, default sync flags
 *                 (the commit syncs); reads in a read transaction renewed
 *                 every 1000 operations (a per-op transaction would cost
 *                 LMDB more); seek = cursor MDB_SET_RANGE + MDB_NEXT
 *   rocksdb       rocksdb_put/delete with WriteOptions sync=true and the
 *                 WAL, default Options; gets with rocksdb_get_pinned (no
 *                 copy); seek = a new iterator per seek, as db_bench does
 *   pmdk-btree, pmdk-hashmap   PMDK's btree_map and hashmap_tx examples
 *                 (libpmemobj-dev) with PMEM_IS_PMEM_FORCE=1 on the same
 *                 directory; their keys are uint64_t: the first 8 bytes of
 *                 each key (distinct). A put is one transaction (allocate
 *                 and fill the value, remove and free the old one, insert);
 *                 a lock around every call (the examples are not
 *                 thread-safe); no range seek. Flushed lines and fences
 *                 counted by bench/pmdk_count.c
 *   floor-2f, floor-2f-slot, floor-1f   no store: a DRAM hash of key ->
 *                 offset and records
 *                 appended with CLWB to a prefaulted mapping on --dir, made
 *                 durable with 2 fences (record, then a validating word) or
 *                 1 (a checksummed record): the least a durable put can cost
 *                 on this machine (see fl_store; 1 thread)
 * Metrics: ops_per_s and ns_per_op (wall time of all threads / ops),
 * cpu_ns_per_op (process CPU time / ops: what stays comparable on a loaded
 * machine; it does not show thread scaling), for
 * nvheap lines_per_op and fences_per_op (flushed lines and fences per
 * operation), and vs_lmdb / vs_rocksdb: nvheap's ops_per_s over the peer's
 * in the same case (ratio of medians), and cpu_vs_lmdb / cpu_vs_rocksdb, the
 * same by CPU time. A peer whose library was not found
 * at build time (liblmdb-dev, librocksdb-dev) is skipped with a note.
 * Runs interleave the subjects (run 1 of each, then run 2 of each, ...).
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

#ifdef NVH_BENCH_LMDB
#include <lmdb.h>
#endif
#ifdef NVH_BENCH_ROCKSDB
#include <rocksdb/c.h>
#endif
#ifdef NVH_BENCH_PMDK
#include <libpmemobj.h>
#include "btree_map.h"
#include "hashmap_tx.h"
#include "pmdk_count.h"
#endif

#define KEY_LEN 16
#define MAX_THREADS 8
#define MAX_RUNS 16
#define SEEK_NEXT 100

static const bench_info info = {
    .name = "kv",
    .summary = "key-value store (nvh_kv sorted/hash) vs LMDB and RocksDB: db_bench workloads",
    .baseline = "lmdb",
    .ratio_metric = "ops_per_s",
    .usage = "  --keys N        keys per store (default 1000000, quick 20000)\n"
             "  --values LIST   value sizes in bytes (default 100,1024)\n"
             "  --threads LIST  thread counts (default 1,2)\n"
             "  --subjects LIST comma-separated (default nvheap-sorted,nvheap-hash,lmdb,\n"
             "                  rocksdb,pmdk-btree,pmdk-hashmap,floor-2f,\n"
             "                  floor-2f-slot,floor-1f)\n"
             "  --workloads LIST  comma-separated (default all: fillseq,fillrandom,\n"
             "                  overwrite,readrandom,readmissing,readseq,seekrandom,\n"
             "                  deleterandom)\n",
};

enum workload { W_FILLSEQ, W_FILLRANDOM, W_OVERWRITE, W_READRANDOM, W_READMISSING, W_READSEQ,
                W_SEEKRANDOM, W_DELETERANDOM, W_COUNT };
static const char *const workload_names[W_COUNT] = {
    "fillseq", "fillrandom", "overwrite", "readrandom", "readmissing", "readseq",
    "seekrandom", "deleterandom"};

static bool list_has(const char *list, const char *name)
{
    if (!list) return true;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

/* ==========================================================================
 * Keys and values
 * ========================================================================== */
/* Key i (i < 2^63): 16 random-looking bytes whose first 8 are a bijection
 * of i, so keys are distinct; i >= N gives the absent keys. */
static void make_key(uint64_t i, unsigned char out[KEY_LEN])
{
    uint64_t s = i, a = bench_rand(&s), b = bench_rand(&s);
    memcpy(out, &a, 8);
    memcpy(out + 8, &b, 8);
}

typedef struct keyset {
    uint64_t n;
    unsigned char (*keys)[KEY_LEN];     /* present keys, in creation order */
    unsigned char (*missing)[KEY_LEN];  /* absent keys */
    uint32_t *sorted;                   /* indices in bytewise key order */
    uint32_t *order[3];                 /* random permutations: fill, overwrite/read, delete */
} keyset;

static const keyset *g_sort_keys;
static int cmp_index(const void *a, const void *b)
{
    return memcmp(g_sort_keys->keys[*(const uint32_t *)a], g_sort_keys->keys[*(const uint32_t *)b],
                  KEY_LEN);
}

static void keyset_make(keyset *k, uint64_t n)
{
    k->n = n;
    k->keys = malloc(n * KEY_LEN);
    k->missing = malloc(n * KEY_LEN);
    k->sorted = malloc(n * sizeof *k->sorted);
    for (int j = 0; j < 3; j++) k->order[j] = malloc(n * sizeof *k->order[j]);
    if (!k->keys || !k->missing || !k->sorted || !k->order[0] || !k->order[1] || !k->order[2]) {
        perror("malloc");
        exit(1);
    }
    for (uint64_t i = 0; i < n; i++) {
        make_key(i, k->keys[i]);
        make_key(n + i + 1000, k->missing[i]);
        k->sorted[i] = (uint32_t)i;
    }
    g_sort_keys = k;
    qsort(k->sorted, n, sizeof *k->sorted, cmp_index);
    for (int j = 0; j < 3; j++) {
        uint64_t s = 1234 + (uint64_t)j;
        for (uint64_t i = 0; i < n; i++) k->order[j][i] = (uint32_t)i;
        for (uint64_t i = n - 1; i > 0; i--) {
            uint64_t r = bench_rand(&s) % (i + 1);
            uint32_t x = k->order[j][i];
            k->order[j][i] = k->order[j][r];
            k->order[j][r] = x;
        }
    }
}

static void keyset_free(keyset *k)
{
    free(k->keys);
    free(k->missing);
    free(k->sorted);
    for (int j = 0; j < 3; j++) free(k->order[j]);
}

/* ==========================================================================
 * Subjects: one table of operations each
 * ========================================================================== */
typedef struct subject {
    const char *name;
    bool ordered;                       /* seeks make sense */
    /* a fresh empty store for n keys of vlen-byte values at path */
    void *(*open)(const bench_opts *opts, const char *path, uint64_t n, size_t vlen);
    void (*close)(void *s);
    void *(*thread_begin)(void *s);     /* per-thread context (read txn), or NULL */
    void (*thread_end)(void *s, void *t);
    int (*put)(void *s, void *t, const void *k, const void *v, size_t vl);
    int (*get)(void *s, void *t, const void *k, uint64_t *sum);   /* 0 found, 1 absent */
    int (*del)(void *s, void *t, const void *k);
    uint64_t (*scan)(void *s, uint64_t *sum);                    /* entries seen */
    uint64_t (*seek)(void *s, void *t, const void *k, uint64_t *sum); /* entries seen */
    nvh_pool *(*pool)(void *s);         /* nvheap: for the flush/fence counters */
    void (*count_begin)(void *s);       /* a subject that counts its own lines and fences */
    bench_counts (*counts)(void *s, uint64_t ops);
} subject;

/* ---- nvheap ----------------------------------------------------------------- */
typedef struct nv_store {
    nvh_pool *pool;
    nvh_kv *kv;
} nv_store;

static void *nv_open(const bench_opts *opts, const char *path, uint64_t n, size_t vlen,
                     const char *engine)
{
    (void)opts;
    uint64_t size = n * (vlen + KEY_LEN + 160) * 2 + (64ull << 20);
    nvh_pool_options po = {.max_size = size * 4};
    nv_store *s = calloc(1, sizeof *s);
    s->pool = nvh_pool_create_ex(path, "nvkv", size, NVH_DOMAIN_PMEM | NVH_POOL_PREFAULT, &po);
    if (!s->pool) {
        fprintf(stderr, "kv: nvheap pool %s: %s\n", path, nvh_errormsg());
        free(s);
        return NULL;
    }
    nvh_kv_config c = {.engine = engine, .create = NVH_KV_CREATE_NEW};
    s->kv = nvh_kv_open_pool(s->pool, &c);
    if (!s->kv) {
        fprintf(stderr, "kv: nvheap %s store: %s\n", engine, nvh_errormsg());
        nvh_pool_close(s->pool);
        free(s);
        return NULL;
    }
    return s;
}
static void *nv_open_sorted(const bench_opts *o, const char *p, uint64_t n, size_t v)
{
    return nv_open(o, p, n, v, "sorted");
}
static void *nv_open_hash(const bench_opts *o, const char *p, uint64_t n, size_t v)
{
    return nv_open(o, p, n, v, "hash");
}
static void nv_close(void *p)
{
    nv_store *s = p;
    nvh_kv_close(s->kv);
    nvh_pool_close(s->pool);
    free(s);
}
static int nv_put(void *p, void *t, const void *k, const void *v, size_t vl)
{
    (void)t;
    return nvh_kv_put(((nv_store *)p)->kv, k, KEY_LEN, v, vl) == NVH_OK ? 0 : -1;
}
static int nv_value(const void *v, size_t vl, void *arg)
{
    *(uint64_t *)arg += vl + (vl ? ((const unsigned char *)v)[vl - 1] : 0);
    return 0;
}
static int nv_get(void *p, void *t, const void *k, uint64_t *sum)
{
    (void)t;
    int rc = nvh_kv_get(((nv_store *)p)->kv, k, KEY_LEN, nv_value, sum);
    return rc == NVH_OK ? 0 : rc == NVH_E_NOTFOUND ? 1 : -1;
}
static int nv_del(void *p, void *t, const void *k)
{
    (void)t;
    return nvh_kv_remove(((nv_store *)p)->kv, k, KEY_LEN) == NVH_OK ? 0 : -1;
}
struct nv_scan { uint64_t n, sum; };
static int nv_entry(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    struct nv_scan *s = arg;
    s->n++;
    s->sum += kl + vl + (vl ? ((const unsigned char *)v)[vl - 1] : 0) + ((const unsigned char *)k)[0];
    return 0;
}
static uint64_t nv_scan(void *p, uint64_t *sum)
{
    struct nv_scan s = {0, 0};
    if (nvh_kv_get_all(((nv_store *)p)->kv, nv_entry, &s) != NVH_OK) return 0;
    *sum += s.sum;
    return s.n;
}
struct nv_seek { uint64_t n, sum; };
static int nv_seek_entry(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    (void)k; (void)kl;
    struct nv_seek *s = arg;
    s->sum += vl + (vl ? ((const unsigned char *)v)[vl - 1] : 0);
    return ++s->n == SEEK_NEXT + 1;      /* non-zero stops the scan */
}
/* Seek + 100 nexts as an ordered scan from the key that stops itself: the
 * present key itself is not included (keys > k), 101 entries are read. */
static uint64_t nv_seek(void *p, void *t, const void *k, uint64_t *sum)
{
    (void)t;
    struct nv_seek s = {0, 0};
    int rc = nvh_kv_get_above(((nv_store *)p)->kv, k, KEY_LEN, nv_seek_entry, &s);
    if (rc < 0) return 0;
    *sum += s.sum;
    return s.n;
}
static nvh_pool *nv_pool(void *p) { return ((nv_store *)p)->pool; }

/* ---- LMDB ------------------------------------------------------------------- */
#ifdef NVH_BENCH_LMDB
typedef struct lm_store {
    MDB_env *env;
    MDB_dbi dbi;
    char dir[512];
} lm_store;
typedef struct lm_thread {
    MDB_txn *rtxn;
    unsigned uses;
} lm_thread;

static void *lm_open(const bench_opts *opts, const char *path, uint64_t n, size_t vlen)
{
    (void)opts;
    lm_store *s = calloc(1, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "%s", path);
    if (mkdir(s->dir, 0700) != 0) { perror(s->dir); free(s); return NULL; }
    size_t map = (size_t)(n * (vlen + KEY_LEN + 64) * 3) + (256ull << 20);
    MDB_txn *txn;
    int rc = mdb_env_create(&s->env);
    if (!rc) rc = mdb_env_set_mapsize(s->env, map);
    if (!rc) rc = mdb_env_set_maxreaders(s->env, 64);
    if (!rc) rc = mdb_env_open(s->env, s->dir, 0, 0600);   /* default: sync at commit */
    if (!rc) rc = mdb_txn_begin(s->env, NULL, 0, &txn);
    if (!rc) rc = mdb_dbi_open(txn, NULL, 0, &s->dbi);
    if (!rc) rc = mdb_txn_commit(txn);
    if (rc) {
        fprintf(stderr, "kv: lmdb %s: %s\n", s->dir, mdb_strerror(rc));
        free(s);
        return NULL;
    }
    return s;
}
static void lm_close(void *p)
{
    lm_store *s = p;
    mdb_env_close(s->env);
    char f[600];
    snprintf(f, sizeof f, "%s/data.mdb", s->dir);
    unlink(f);
    snprintf(f, sizeof f, "%s/lock.mdb", s->dir);
    unlink(f);
    rmdir(s->dir);
    free(s);
}
static void *lm_thread_begin(void *p)
{
    (void)p;
    return calloc(1, sizeof(lm_thread));
}
static void lm_thread_end(void *p, void *t)
{
    (void)p;
    lm_thread *l = t;
    if (l->rtxn) mdb_txn_abort(l->rtxn);
    free(l);
}
/* The thread's read transaction, renewed every 1000 uses. */
static MDB_txn *lm_rtxn(lm_store *s, lm_thread *l)
{
    if (l->rtxn && ++l->uses % 1000 == 0) {
        mdb_txn_reset(l->rtxn);
        if (mdb_txn_renew(l->rtxn) != 0) { mdb_txn_abort(l->rtxn); l->rtxn = NULL; }
    }
    if (!l->rtxn && mdb_txn_begin(s->env, NULL, MDB_RDONLY, &l->rtxn) != 0) l->rtxn = NULL;
    return l->rtxn;
}
static int lm_put(void *p, void *t, const void *k, const void *v, size_t vl)
{
    (void)t;
    lm_store *s = p;
    MDB_txn *txn;
    MDB_val key = {KEY_LEN, (void *)k}, val = {vl, (void *)v};
    if (mdb_txn_begin(s->env, NULL, 0, &txn)) return -1;
    if (mdb_put(txn, s->dbi, &key, &val, 0)) { mdb_txn_abort(txn); return -1; }
    return mdb_txn_commit(txn) ? -1 : 0;
}
static int lm_get(void *p, void *t, const void *k, uint64_t *sum)
{
    lm_store *s = p;
    MDB_txn *txn = lm_rtxn(s, t);
    if (!txn) return -1;
    MDB_val key = {KEY_LEN, (void *)k}, val;
    int rc = mdb_get(txn, s->dbi, &key, &val);
    if (rc == MDB_NOTFOUND) return 1;
    if (rc) return -1;
    *sum += val.mv_size + (val.mv_size ? ((unsigned char *)val.mv_data)[val.mv_size - 1] : 0);
    return 0;
}
static int lm_del(void *p, void *t, const void *k)
{
    (void)t;
    lm_store *s = p;
    MDB_txn *txn;
    MDB_val key = {KEY_LEN, (void *)k};
    if (mdb_txn_begin(s->env, NULL, 0, &txn)) return -1;
    if (mdb_del(txn, s->dbi, &key, NULL)) { mdb_txn_abort(txn); return -1; }
    return mdb_txn_commit(txn) ? -1 : 0;
}
static uint64_t lm_scan(void *p, uint64_t *sum)
{
    lm_store *s = p;
    MDB_txn *txn;
    MDB_cursor *c;
    uint64_t n = 0;
    if (mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn)) return 0;
    if (mdb_cursor_open(txn, s->dbi, &c) == 0) {
        MDB_val key, val;
        for (int rc = mdb_cursor_get(c, &key, &val, MDB_FIRST); rc == 0;
             rc = mdb_cursor_get(c, &key, &val, MDB_NEXT)) {
            n++;
            *sum += key.mv_size + val.mv_size + ((unsigned char *)key.mv_data)[0] +
                    (val.mv_size ? ((unsigned char *)val.mv_data)[val.mv_size - 1] : 0);
        }
        mdb_cursor_close(c);
    }
    mdb_txn_abort(txn);
    return n;
}
static uint64_t lm_seek(void *p, void *t, const void *k, uint64_t *sum)
{
    lm_store *s = p;
    MDB_txn *txn = lm_rtxn(s, t);
    MDB_cursor *c;
    if (!txn || mdb_cursor_open(txn, s->dbi, &c)) return 0;
    MDB_val key = {KEY_LEN, (void *)k}, val;
    uint64_t n = 0;
    for (int rc = mdb_cursor_get(c, &key, &val, MDB_SET_RANGE); rc == 0 && n < SEEK_NEXT + 1;
         rc = mdb_cursor_get(c, &key, &val, MDB_NEXT)) {
        n++;
        *sum += val.mv_size + (val.mv_size ? ((unsigned char *)val.mv_data)[val.mv_size - 1] : 0);
    }
    mdb_cursor_close(c);
    return n;
}
#endif

/* ---- RocksDB ---------------------------------------------------------------- */
#ifdef NVH_BENCH_ROCKSDB
typedef struct rk_store {
    rocksdb_t *db;
    rocksdb_options_t *options;
    rocksdb_writeoptions_t *wo;
    rocksdb_readoptions_t *ro;
    char dir[512];
} rk_store;

static void *rk_open(const bench_opts *opts, const char *path, uint64_t n, size_t vlen)
{
    (void)opts; (void)n; (void)vlen;
    rk_store *s = calloc(1, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "%s", path);
    s->options = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(s->options, 1);
    rocksdb_options_set_error_if_exists(s->options, 1);
    char *err = NULL;
    s->db = rocksdb_open(s->options, s->dir, &err);
    if (err) {
        fprintf(stderr, "kv: rocksdb %s: %s\n", s->dir, err);
        rocksdb_free(err);
        rocksdb_options_destroy(s->options);
        free(s);
        return NULL;
    }
    s->wo = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(s->wo, 1);            /* durable on return, WAL on */
    s->ro = rocksdb_readoptions_create();
    return s;
}
static void rk_close(void *p)
{
    rk_store *s = p;
    rocksdb_close(s->db);
    char *err = NULL;
    rocksdb_destroy_db(s->options, s->dir, &err);
    if (err) rocksdb_free(err);
    rmdir(s->dir);
    rocksdb_writeoptions_destroy(s->wo);
    rocksdb_readoptions_destroy(s->ro);
    rocksdb_options_destroy(s->options);
    free(s);
}
static int rk_put(void *p, void *t, const void *k, const void *v, size_t vl)
{
    (void)t;
    rk_store *s = p;
    char *err = NULL;
    rocksdb_put(s->db, s->wo, k, KEY_LEN, v, vl, &err);
    if (err) { rocksdb_free(err); return -1; }
    return 0;
}
static int rk_get(void *p, void *t, const void *k, uint64_t *sum)
{
    (void)t;
    rk_store *s = p;
    char *err = NULL;
    rocksdb_pinnableslice_t *v = rocksdb_get_pinned(s->db, s->ro, k, KEY_LEN, &err);
    if (err) { rocksdb_free(err); return -1; }
    if (!v) return 1;
    size_t vl;
    const char *d = rocksdb_pinnableslice_value(v, &vl);
    if (!d) { rocksdb_pinnableslice_destroy(v); return 1; }
    *sum += vl + (vl ? (unsigned char)d[vl - 1] : 0);
    rocksdb_pinnableslice_destroy(v);
    return 0;
}
static int rk_del(void *p, void *t, const void *k)
{
    (void)t;
    rk_store *s = p;
    char *err = NULL;
    rocksdb_delete(s->db, s->wo, k, KEY_LEN, &err);
    if (err) { rocksdb_free(err); return -1; }
    return 0;
}
static uint64_t rk_scan(void *p, uint64_t *sum)
{
    rk_store *s = p;
    rocksdb_iterator_t *it = rocksdb_create_iterator(s->db, s->ro);
    uint64_t n = 0;
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl), *v = rocksdb_iter_value(it, &vl);
        n++;
        *sum += kl + vl + (unsigned char)k[0] + (vl ? (unsigned char)v[vl - 1] : 0);
    }
    rocksdb_iter_destroy(it);
    return n;
}
static uint64_t rk_seek(void *p, void *t, const void *k, uint64_t *sum)
{
    (void)t;
    rk_store *s = p;
    rocksdb_iterator_t *it = rocksdb_create_iterator(s->db, s->ro);
    uint64_t n = 0;
    for (rocksdb_iter_seek(it, k, KEY_LEN); rocksdb_iter_valid(it) && n < SEEK_NEXT + 1;
         rocksdb_iter_next(it)) {
        size_t vl;
        const char *v = rocksdb_iter_value(it, &vl);
        n++;
        *sum += vl + (vl ? (unsigned char)v[vl - 1] : 0);
    }
    rocksdb_iter_destroy(it);
    return n;
}
#endif

/* ---- PMDK's btree_map and hashmap_tx examples (8-byte keys) ------------------- */
#ifdef NVH_BENCH_PMDK
/* The examples take uint64_t keys: the first 8 bytes of the 16-byte key,
 * which are distinct by construction (make_key). They are not thread-safe:
 * a lock around every call (shared for reads). A put is one transaction
 * that allocates and fills the value, removes and frees the old one, and
 * inserts the new (the examples insert duplicates otherwise). */
typedef struct pm_store {
    PMEMobjpool *pop;
    bool hash;
    TOID(struct btree_map) bt;
    TOID(struct hashmap_tx) hm;
    pthread_rwlock_t lock;
} pm_store;

struct pm_root {
    TOID(struct btree_map) bt;
    TOID(struct hashmap_tx) hm;
};

static uint64_t pm_key(const void *k)
{
    uint64_t x;
    memcpy(&x, k, 8);
    return x;
}

static void *pm_open(const bench_opts *opts, const char *path, uint64_t n, size_t vlen, bool hash)
{
    (void)opts;
    pm_store *s = calloc(1, sizeof *s);
    s->hash = hash;
    size_t size = (size_t)(n * (vlen + 256) * 2) + (64ull << 20);
    int prefault = 1;
    pmemobj_ctl_set(NULL, "prefault.at_create", &prefault);
    s->pop = pmemobj_create(path, "bench-kv", size, 0600);
    if (!s->pop) {
        fprintf(stderr, "kv: pmdk %s: %s\n", path, pmemobj_errormsg());
        free(s);
        return NULL;
    }
    struct pm_root *root = pmemobj_direct(pmemobj_root(s->pop, sizeof *root));
    int rc = hash ? hm_tx_create(s->pop, &root->hm, NULL) : btree_map_create(s->pop, &root->bt, NULL);
    if (rc != 0) {
        fprintf(stderr, "kv: pmdk %s map create failed\n", hash ? "hashmap_tx" : "btree_map");
        pmemobj_close(s->pop);
        free(s);
        return NULL;
    }
    if (hash) hm_tx_init(s->pop, root->hm);
    s->bt = root->bt;
    s->hm = root->hm;
    pthread_rwlock_init(&s->lock, NULL);
    return s;
}
static void *pm_open_btree(const bench_opts *o, const char *p, uint64_t n, size_t v)
{
    return pm_open(o, p, n, v, false);
}
static void *pm_open_hash(const bench_opts *o, const char *p, uint64_t n, size_t v)
{
    return pm_open(o, p, n, v, true);
}
static void pm_close(void *p)
{
    pm_store *s = p;
    pmemobj_close(s->pop);
    pthread_rwlock_destroy(&s->lock);
    free(s);
}
static void *pm_thread_begin(void *p)
{
    (void)p;
    static _Atomic unsigned next = 1;
    pmdk_count_set_worker(next++ % PMDK_COUNT_MAX_WORKERS);
    return NULL;
}
static PMEMoid pm_get_oid(pm_store *s, uint64_t key)
{
    return s->hash ? hm_tx_get(s->pop, s->hm, key) : btree_map_get(s->pop, s->bt, key);
}
/* The example's btree_map_remove faults on an absent key: look first. */
static PMEMoid pm_remove_oid(pm_store *s, uint64_t key)
{
    if (s->hash) return hm_tx_remove(s->pop, s->hm, key);
    if (!btree_map_lookup(s->pop, s->bt, key)) return OID_NULL;
    return btree_map_remove(s->pop, s->bt, key);
}
/* Its own function: TX_BEGIN is setjmp-based. */
static __attribute__((noinline)) int pm_put_tx(pm_store *s, uint64_t key, const void *v, size_t vl)
{
    volatile int rc = 0;       /* set after setjmp: volatile */
    TX_BEGIN(s->pop) {
        PMEMoid nv = pmemobj_tx_alloc(vl ? vl : 1, 1);
        memcpy(pmemobj_direct(nv), v, vl);
        PMEMoid old = pm_remove_oid(s, key);
        if (!OID_IS_NULL(old)) pmemobj_tx_free(old);
        if (s->hash) hm_tx_insert(s->pop, s->hm, key, nv);
        else btree_map_insert(s->pop, s->bt, key, nv);
    } TX_ONABORT {
        rc = -1;
    } TX_END
    return rc;
}
static int pm_put(void *p, void *t, const void *k, const void *v, size_t vl)
{
    (void)t;
    pm_store *s = p;
    pthread_rwlock_wrlock(&s->lock);
    int rc = pm_put_tx(s, pm_key(k), v, vl);
    pthread_rwlock_unlock(&s->lock);
    return rc;
}
static int pm_get(void *p, void *t, const void *k, uint64_t *sum)
{
    (void)t;
    pm_store *s = p;
    pthread_rwlock_rdlock(&s->lock);
    PMEMoid v = pm_get_oid(s, pm_key(k));
    int rc = 1;
    if (!OID_IS_NULL(v)) {
        size_t vl = pmemobj_alloc_usable_size(v);
        const unsigned char *d = pmemobj_direct(v);
        *sum += vl + d[0];
        rc = 0;
    }
    pthread_rwlock_unlock(&s->lock);
    return rc;
}
static __attribute__((noinline)) int pm_del_tx(pm_store *s, uint64_t key)
{
    volatile int rc = 0;
    TX_BEGIN(s->pop) {
        PMEMoid old = pm_remove_oid(s, key);
        if (OID_IS_NULL(old)) rc = -1;
        else pmemobj_tx_free(old);
    } TX_ONABORT {
        rc = -1;
    } TX_END
    return rc;
}
static int pm_del(void *p, void *t, const void *k)
{
    (void)t;
    pm_store *s = p;
    pthread_rwlock_wrlock(&s->lock);
    int rc = pm_del_tx(s, pm_key(k));
    pthread_rwlock_unlock(&s->lock);
    return rc;
}
struct pm_scan { PMEMobjpool *pop; uint64_t n, sum; };
static int pm_entry(uint64_t key, PMEMoid value, void *arg)
{
    struct pm_scan *c = arg;
    const unsigned char *d = pmemobj_direct(value);
    c->n++;
    c->sum += (key & 0xff) + d[0];
    return 0;
}
static uint64_t pm_scan(void *p, uint64_t *sum)
{
    pm_store *s = p;
    struct pm_scan c = {s->pop, 0, 0};
    if (s->hash) hm_tx_foreach(s->pop, s->hm, pm_entry, &c);
    else btree_map_foreach(s->pop, s->bt, pm_entry, &c);
    *sum += c.sum;
    return c.n;
}
#endif

/* ---- floor: no store, the least a durable put can cost here ------------------
 * floor-2f, floor-2f-slot, floor-1f: library-free lower bounds for a durable put on this
 * machine. A DRAM open-addressing hash (key hash -> record offset, linear
 * probing, never resized: sized for the keys) and records appended to a
 * file on --dir mapped shared and prefaulted, the same medium as nvheap's
 * pool. A record is one header word {check: 32, klen: 16, vlen: 16}, the
 * key, the value, rounded up to whole 64-byte lines (16 B keys, 100 B
 * values: 2 lines). Each put: key hash and probe, the record written and
 * its lines written back with CLWB, then
 *   floor-2f  SFENCE (the record durable); the header's check word set to a
 *             commit mark, CLWB, SFENCE (validated): 2 fences, 3 lines.
 *             The validating word shares the record's first line, the
 *             cheapest place a design can put it (a store's slot word in an
 *             index line elsewhere costs one more line written back).
 *   floor-2f-slot  as floor-2f, but the validating word is the record's
 *             offset stored into a persistent slot array at the key's hash
 *             (8-byte slots, 2 per key): what a store whose index names its
 *             records in pmem (a leaf slot, a bucket) pays for a random
 *             line: 2 fences, 3 lines, one of them a random one.
 *   floor-1f  the check word is the CRC32C of the rest of the record, so a
 *             torn record is told from a whole one at recovery: one SFENCE,
 *             2 lines. Overwrites append a new record (recovery takes the
 *             newest by log position) and removes append a tombstone
 *             (vlen 0xffff).
 * No recovery, no space reuse, no concurrency control beyond one spin lock
 * (run them with --threads 1): what is left is the hash probe's miss, the
 * record's stores and the write-back and fence stalls any design pays. */
typedef struct fl_store {
    unsigned char *log;          /* the mapping */
    size_t size, tail;           /* bytes mapped, bytes appended */
    uint64_t *tab;               /* 2 words per slot: hash | 1 (0 empty), offset + 1 (0 removed) */
    uint64_t mask;               /* slots - 1 */
    int fences;                  /* 1 or 2 */
    uint64_t *slots;             /* floor-2f-slot: the persistent slots (in the mapping) */
    uint64_t smask;
    uint64_t lines, sfences;     /* counted since fl_count_begin */
    atomic_flag lock;
    char path[512];
} fl_store;

#define FL_COMMIT 0x600DC0DEu
#define FL_TOMB 0xffffu


#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t fl_crc(const unsigned char *p, size_t len)
{
    uint64_t c = 0xffffffffu;
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
    }
    uint32_t c32 = (uint32_t)c;
    while (len--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}
#else
static uint32_t fl_crc(const unsigned char *p, size_t len)
{
    uint32_t c = 0xffffffffu;
    while (len--) {
        c ^= *p++;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
    }
    return ~c;
}
#endif

static inline uint64_t fl_hash(const unsigned char *k)
{
    uint64_t a, b;
    memcpy(&a, k, 8);
    memcpy(&b, k + 8, 8);
    uint64_t h = (a ^ (b * 0x9e3779b97f4a7c15ull)) * 0xff51afd7ed558ccdull;
    return (h ^ (h >> 29)) | 1;
}

static void *fl_open(const bench_opts *opts, const char *path, uint64_t n, size_t vlen, int fences,
                     bool slots)
{
    (void)opts;
    fl_store *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->fences = fences;
    atomic_flag_clear(&s->lock);
    snprintf(s->path, sizeof s->path, "%s", path);
    size_t rec = (8 + KEY_LEN + vlen + 63) & ~(size_t)63;
    uint64_t nslots = 1;
    while (nslots < 2 * n) nslots <<= 1;
    size_t sbytes = slots ? nslots * 8 : 0;
    s->size = (size_t)n * (2 * rec + 64) + (1u << 20) + sbytes;  /* fill, overwrite, tombstones */
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)s->size) != 0) {
        perror(path);
        if (fd >= 0) close(fd);
        free(s);
        return NULL;
    }
    s->log = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s->log == MAP_FAILED) { perror("mmap"); free(s); return NULL; }
    for (size_t o = 0; o < s->size; o += 4096) s->log[o] = 0;      /* prefault */
    if (slots) {                        /* the slot array first, the log after it */
        s->slots = (uint64_t *)s->log;
        s->smask = nslots - 1;
        s->tail = sbytes;
    }
    s->mask = nslots - 1;       /* the DRAM table: as many slots */
    s->tab = calloc(nslots, 2 * sizeof(uint64_t));
    if (!s->tab) { munmap(s->log, s->size); free(s); return NULL; }
    return s;
}
static void *fl_open_2f(const bench_opts *o, const char *p, uint64_t n, size_t v)
{
    return fl_open(o, p, n, v, 2, false);
}
static void *fl_open_2f_slot(const bench_opts *o, const char *p, uint64_t n, size_t v)
{
    return fl_open(o, p, n, v, 2, true);
}
static void *fl_open_1f(const bench_opts *o, const char *p, uint64_t n, size_t v)
{
    return fl_open(o, p, n, v, 1, false);
}
static void fl_close(void *p)
{
    fl_store *s = p;
    munmap(s->log, s->size);
    unlink(s->path);
    free(s->tab);
    free(s);
}

/* The slot of key k: the one holding it (or that held it, removed: its
 * offset 0; 64-bit hashes are taken as distinct there), else the first empty
 * one of its probe sequence. */
static uint64_t *fl_find(fl_store *s, const unsigned char *k, uint64_t h)
{
    for (uint64_t i = h & s->mask;; i = (i + 1) & s->mask) {
        uint64_t *e = &s->tab[2 * i];
        if (e[0] == 0) return e;
        if (e[0] == h && e[1]) {
            const unsigned char *r = s->log + e[1] - 1;
            if (memcmp(r + 8, k, KEY_LEN) == 0) return e;
        } else if (e[0] == h) {
            return e;
        }
    }
}

/* Append one record (vl == FL_TOMB: a tombstone) and make it durable;
 * h: the key's hash (floor-2f-slot's slot). */
static uint64_t fl_append(fl_store *s, const unsigned char *k, const void *v, size_t vl,
                          uint64_t h)
{
    size_t body = 8 + KEY_LEN + (vl == FL_TOMB ? 0 : vl);
    size_t rec = (body + 63) & ~(size_t)63;
    if (s->tail + rec > s->size) return 0;
    unsigned char *r = s->log + s->tail;
    uint16_t kl16 = KEY_LEN, vl16 = (uint16_t)vl;
    memcpy(r + 4, &kl16, 2);
    memcpy(r + 6, &vl16, 2);
    memcpy(r + 8, k, KEY_LEN);
    if (vl != FL_TOMB) memcpy(r + 8 + KEY_LEN, v, vl);
    uint32_t check = s->fences == 1 ? fl_crc(r + 4, body - 4) : 0;
    memcpy(r, &check, 4);
    for (size_t l = 0; l < rec; l += 64) bench_clwb(r + l);
    bench_sfence();                                            /* FENCE 1 */
    s->lines += rec / 64;
    s->sfences++;
    if (s->fences == 2 && s->slots) {
        uint64_t *w = &s->slots[(h >> 7) & s->smask];        /* the validating word */
        *w = s->tail + 1;
        bench_clwb(w);
        bench_sfence();                                        /* FENCE 2 */
        s->lines++;
        s->sfences++;
    } else if (s->fences == 2) {
        uint32_t c = FL_COMMIT;
        memcpy(r, &c, 4);                                   /* the validating word */
        bench_clwb(r);
        bench_sfence();                                        /* FENCE 2 */
        s->lines++;
        s->sfences++;
    }
    uint64_t off = s->tail;
    s->tail += rec;
    return off + 1;
}

static int fl_put(void *p, void *t, const void *k, const void *v, size_t vl)
{
    (void)t;
    fl_store *s = p;
    if (vl >= FL_TOMB) return -1;
    uint64_t h = fl_hash(k);
    while (atomic_flag_test_and_set_explicit(&s->lock, memory_order_acquire)) {}
    uint64_t *e = fl_find(s, k, h);
    uint64_t off = fl_append(s, k, v, vl, h);
    if (off) { e[0] = h; e[1] = off; }
    atomic_flag_clear_explicit(&s->lock, memory_order_release);
    return off ? 0 : -1;
}
static int fl_get(void *p, void *t, const void *k, uint64_t *sum)
{
    (void)t;
    fl_store *s = p;
    uint64_t *e = fl_find(s, k, fl_hash(k));
    if (!e[1]) return 1;
    const unsigned char *r = s->log + e[1] - 1;
    uint16_t vl;
    memcpy(&vl, r + 6, 2);
    *sum += vl + (vl ? r[8 + KEY_LEN + vl - 1] : 0);
    return 0;
}
static int fl_del(void *p, void *t, const void *k)
{
    (void)t;
    fl_store *s = p;
    int rc = -1;
    while (atomic_flag_test_and_set_explicit(&s->lock, memory_order_acquire)) {}
    uint64_t h = fl_hash(k);
    uint64_t *e = fl_find(s, k, h);
    if (e[1] && fl_append(s, k, NULL, FL_TOMB, h)) {
        e[1] = 0;                  /* removed: keeps the probe chain intact */
        rc = 0;
    }
    atomic_flag_clear_explicit(&s->lock, memory_order_release);
    return rc;
}
static uint64_t fl_scan(void *p, uint64_t *sum)
{
    fl_store *s = p;
    uint64_t n = 0;
    for (uint64_t i = 0; i <= s->mask; i++)
        if (s->tab[2 * i + 1]) {
            const unsigned char *r = s->log + s->tab[2 * i + 1] - 1;
            uint16_t vl;
            memcpy(&vl, r + 6, 2);
            *sum += vl + (vl ? r[8 + KEY_LEN + vl - 1] : 0);
            n++;
        }
    return n;
}
static void fl_count_begin(void *p)
{
    fl_store *s = p;
    s->lines = s->sfences = 0;
}
static bench_counts fl_counts(void *p, uint64_t ops)
{
    fl_store *s = p;
    bench_counts c = {0};
    c.lines_per_op = ops ? (double)s->lines / (double)ops : 0;
    c.fences_per_op = ops ? (double)s->sfences / (double)ops : 0;
    return c;
}

static const subject g_subjects[] = {
    {"nvheap-sorted", true, nv_open_sorted, nv_close, NULL, NULL, nv_put, nv_get, nv_del,
     nv_scan, nv_seek, nv_pool, NULL, NULL},
    {"nvheap-hash", false, nv_open_hash, nv_close, NULL, NULL, nv_put, nv_get, nv_del, nv_scan,
     NULL, nv_pool, NULL, NULL},
#ifdef NVH_BENCH_LMDB
    {"lmdb", true, lm_open, lm_close, lm_thread_begin, lm_thread_end, lm_put, lm_get, lm_del,
     lm_scan, lm_seek, NULL, NULL, NULL},
#endif
#ifdef NVH_BENCH_PMDK
    /* no range seek in the examples: seekrandom is not run */
    {"pmdk-btree", false, pm_open_btree, pm_close, pm_thread_begin, NULL, pm_put, pm_get, pm_del,
     pm_scan, NULL, NULL, NULL, NULL},
    {"pmdk-hashmap", false, pm_open_hash, pm_close, pm_thread_begin, NULL, pm_put, pm_get, pm_del,
     pm_scan, NULL, NULL, NULL, NULL},
#endif
#ifdef NVH_BENCH_ROCKSDB
    {"rocksdb", true, rk_open, rk_close, NULL, NULL, rk_put, rk_get, rk_del, rk_scan, rk_seek,
     NULL, NULL, NULL},
#endif
    /* the floor: no store (above) */
    {"floor-2f", false, fl_open_2f, fl_close, NULL, NULL, fl_put, fl_get, fl_del, fl_scan, NULL,
     NULL, fl_count_begin, fl_counts},
    {"floor-2f-slot", false, fl_open_2f_slot, fl_close, NULL, NULL, fl_put, fl_get, fl_del,
     fl_scan, NULL, NULL, fl_count_begin, fl_counts},
    {"floor-1f", false, fl_open_1f, fl_close, NULL, NULL, fl_put, fl_get, fl_del, fl_scan, NULL,
     NULL, fl_count_begin, fl_counts},
};
enum { NSUB = sizeof g_subjects / sizeof g_subjects[0] };

/* ==========================================================================
 * Running one workload on T threads
 * ========================================================================== */
typedef struct phase {
    const subject *sub;
    void *store;
    const keyset *ks;
    enum workload w;
    uint64_t ops;                /* total operations (split between threads) */
    size_t vlen;
    const unsigned char *value;  /* vlen bytes (2 variants: fill / overwrite) */
    unsigned threads;
    pthread_barrier_t barrier;
    _Atomic uint64_t errors;
    _Atomic uint64_t sum;
} phase;

typedef struct worker {
    phase *ph;
    unsigned id;
    pthread_t tid;
} worker;

static const unsigned char *phase_key(const phase *ph, uint64_t i)
{
    const keyset *ks = ph->ks;
    switch (ph->w) {
    case W_FILLSEQ: return ks->keys[ks->sorted[i]];
    case W_FILLRANDOM: return ks->keys[ks->order[0][i]];
    case W_OVERWRITE: case W_READRANDOM: return ks->keys[ks->order[1][i]];
    case W_READMISSING: return ks->missing[i];
    case W_SEEKRANDOM: return ks->keys[ks->order[1][(i * 7919) % ks->n]];
    case W_DELETERANDOM: return ks->keys[ks->order[2][i]];
    default: return ks->keys[i];
    }
}

static void *worker_main(void *arg)
{
    worker *wk = arg;
    phase *ph = wk->ph;
    const subject *sub = ph->sub;
    void *t = sub->thread_begin ? sub->thread_begin(ph->store) : NULL;
    uint64_t from = ph->ops * wk->id / ph->threads, to = ph->ops * (wk->id + 1) / ph->threads;
    uint64_t sum = 0, errors = 0;
    pthread_barrier_wait(&ph->barrier);
    switch (ph->w) {
    case W_FILLSEQ: case W_FILLRANDOM: case W_OVERWRITE:
        for (uint64_t i = from; i < to; i++)
            if (sub->put(ph->store, t, phase_key(ph, i), ph->value, ph->vlen) != 0) errors++;
        break;
    case W_READRANDOM:
        for (uint64_t i = from; i < to; i++)
            if (sub->get(ph->store, t, phase_key(ph, i), &sum) != 0) errors++;
        break;
    case W_READMISSING:
        for (uint64_t i = from; i < to; i++)
            if (sub->get(ph->store, t, phase_key(ph, i), &sum) != 1) errors++;
        break;
    case W_SEEKRANDOM:
        for (uint64_t i = from; i < to; i++)
            if (sub->seek(ph->store, t, phase_key(ph, i), &sum) == 0) errors++;
        break;
    case W_DELETERANDOM:
        for (uint64_t i = from; i < to; i++)
            if (sub->del(ph->store, t, phase_key(ph, i)) != 0) errors++;
        break;
    case W_READSEQ:
        if (sub->scan(ph->store, &sum) != ph->ops) errors++;
        break;
    default:
        break;
    }
    pthread_barrier_wait(&ph->barrier);
    if (sub->thread_end) sub->thread_end(ph->store, t);
    ph->errors += errors;
    ph->sum += sum;
    return NULL;
}

typedef struct measured {
    double ns;            /* wall time; 0 = not run or failed */
    double cpu_ns;        /* process CPU time (user + system, every thread) */
    uint64_t ops;
    bench_counts counts;
    bool have_counts;
} measured;

/* CPU time of the whole process: on a loaded, shared machine wall time
 * mostly measures the other tenants; CPU time per operation is the figure
 * that stays comparable between subjects measured at different moments.
 * It includes the peers' background threads (RocksDB's flushes and
 * compactions) and the kernel's time in their fsync/msync calls. */
static double cpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static measured run_phase(const bench_opts *opts, phase *ph)
{
    measured m = {0};
    worker wk[MAX_THREADS];
    unsigned threads = ph->w == W_READSEQ ? 1 : ph->threads;
    ph->threads = threads;
    ph->errors = 0;
    ph->sum = 0;
    pthread_barrier_init(&ph->barrier, NULL, threads + 1);
    nvh_pool *pool = ph->sub->pool ? ph->sub->pool(ph->store) : NULL;
    for (unsigned i = 0; i < threads; i++) {
        wk[i] = (worker){ph, i, 0};
        pthread_create(&wk[i].tid, NULL, worker_main, &wk[i]);
    }
    bool pmdk = strncmp(ph->sub->name, "pmdk", 4) == 0;
    if (pool) bench_counts_begin(pool);
    if (ph->sub->count_begin) ph->sub->count_begin(ph->store);
#ifdef NVH_BENCH_PMDK
    if (pmdk) pmdk_count_reset();
#endif
    double c0 = cpu_now_ns();
    uint64_t t0 = bench_now_ns();
    pthread_barrier_wait(&ph->barrier);     /* go */
    pthread_barrier_wait(&ph->barrier);     /* all done */
    uint64_t t1 = bench_now_ns();
    double c1 = cpu_now_ns();
    for (unsigned i = 0; i < threads; i++) pthread_join(wk[i].tid, NULL);
    pthread_barrier_destroy(&ph->barrier);
    if (ph->errors) {
        bench_error(opts, "%s %s: %llu of %llu operations failed", ph->sub->name,
                    workload_names[ph->w], (unsigned long long)ph->errors,
                    (unsigned long long)ph->ops);
        return m;
    }
    m.ns = (double)(t1 - t0);
    m.cpu_ns = c1 - c0;
    m.ops = ph->ops;
    if (pool) {
        m.counts = bench_counts_per_op(pool, ph->ops);
        m.have_counts = true;
    }
    if (ph->sub->counts) {
        m.counts = ph->sub->counts(ph->store, ph->ops);
        m.have_counts = true;
    }
#ifdef NVH_BENCH_PMDK
    if (pmdk) {
        pmdk_count c = pmdk_count_total();
        m.counts.lines_per_op = (double)c.lines / (double)ph->ops;
        m.counts.fences_per_op = (double)c.fences / (double)ph->ops;
        m.have_counts = true;
    }
#else
    (void)pmdk;
#endif
    return m;
}

/* ==========================================================================
 * One run of every workload for one subject, value size and thread count
 * ========================================================================== */
static const char *g_workloads;   /* --workloads */

static void run_subject(const bench_opts *opts, const subject *sub, const keyset *ks,
                        size_t vlen, unsigned threads, measured out[W_COUNT])
{
    memset(out, 0, sizeof(measured) * W_COUNT);
    unsigned char *value[2] = {malloc(vlen + 1), malloc(vlen + 1)};
    for (size_t i = 0; i < vlen; i++) {
        value[0][i] = (unsigned char)(i * 31 + 7);
        value[1][i] = (unsigned char)(i * 17 + 3);
    }
    phase ph = {.sub = sub, .ks = ks, .vlen = vlen};
    char tag[64];
    /* fillseq on a store of its own */
    if (list_has(g_workloads, "fillseq")) {
        snprintf(tag, sizeof tag, "%s-seq", sub->name);
        const char *path = bench_scratch_path(opts, NULL, tag);
        ph.store = sub->open(opts, path, ks->n, vlen);
        if (!ph.store) {
            bench_error(opts, "%s: cannot create the store", sub->name);
            goto out;
        }
        ph.w = W_FILLSEQ;
        ph.ops = ks->n;
        ph.value = value[0];
        ph.threads = threads;
        out[W_FILLSEQ] = run_phase(opts, &ph);
        sub->close(ph.store);
        bench_scratch_remove(path);
    }
    snprintf(tag, sizeof tag, "%s-rnd", sub->name);
    const char *path = bench_scratch_path(opts, NULL, tag);
    ph.store = sub->open(opts, path, ks->n, vlen);
    if (!ph.store) {
        bench_error(opts, "%s: cannot create the store", sub->name);
        goto out;
    }
    /* fillrandom always runs: the later workloads need the keys */
    for (int w = W_FILLRANDOM; w < W_COUNT; w++) {
        if (w != W_FILLRANDOM && !list_has(g_workloads, workload_names[w])) continue;
        if (w == W_SEEKRANDOM && !sub->ordered) continue;
        if (w == W_READSEQ && threads != 1) continue;
        ph.w = (enum workload)w;
        ph.ops = w == W_SEEKRANDOM ? (ks->n / 10 ? ks->n / 10 : 1) : ks->n;
        ph.value = value[w == W_OVERWRITE];
        ph.threads = threads;
        out[w] = run_phase(opts, &ph);
    }
    sub->close(ph.store);
    bench_scratch_remove(path);
out:
    free(value[0]);
    free(value[1]);
}

/* ==========================================================================
 * Reporting
 * ========================================================================== */
static double ops_per_s(const measured *m) { return m->ns > 0 ? (double)m->ops / (m->ns / 1e9) : 0; }

/* Median ops/s of one subject in one case (by wall or CPU time), 0 if it
 * did not run. */
static double median_ops_by(measured r[MAX_RUNS][W_COUNT], unsigned runs, int w, bool cpu)
{
    double v[MAX_RUNS];
    unsigned k = 0;
    for (unsigned i = 0; i < runs; i++)
        if (r[i][w].ns > 0 && (!cpu || r[i][w].cpu_ns > 0))
            v[k++] = cpu ? (double)r[i][w].ops / (r[i][w].cpu_ns / 1e9) : ops_per_s(&r[i][w]);
    return k ? bench_median(v, k) : 0;
}
static double median_ops(measured r[MAX_RUNS][W_COUNT], unsigned runs, int w)
{
    return median_ops_by(r, runs, w, false);
}

static void report(const bench_opts *opts, size_t vlen, unsigned threads, unsigned runs,
                   measured r[NSUB][MAX_RUNS][W_COUNT], const bool *ran)
{
    char label[32];
    if (vlen % 1024 == 0) snprintf(label, sizeof label, "%zuKiB-%ut", vlen / 1024, threads);
    else snprintf(label, sizeof label, "%zuB-%ut", vlen, threads);
    int lmdb = -1, rocks = -1;
    for (size_t s = 0; s < NSUB; s++) {
        if (!strcmp(g_subjects[s].name, "lmdb")) lmdb = (int)s;
        if (!strcmp(g_subjects[s].name, "rocksdb")) rocks = (int)s;
    }
    for (int w = 0; w < W_COUNT; w++) {
        char c[64];
        snprintf(c, sizeof c, "%s/%s", workload_names[w], label);
        for (size_t s = 0; s < NSUB; s++) {
            if (!ran[s]) continue;
            double ops[MAX_RUNS], ns[MAX_RUNS], cpu[MAX_RUNS];
            unsigned k = 0;
            for (unsigned i = 0; i < runs; i++) {
                const measured *m = &r[s][i][w];
                if (m->ns <= 0) continue;
                ops[k] = ops_per_s(m);
                ns[k] = m->ns / (double)m->ops;
                cpu[k] = m->cpu_ns / (double)m->ops;
                k++;
            }
            if (!k) continue;
            bench_emit(opts, c, g_subjects[s].name, "ops_per_s", bench_summarize(ops, k), "ops/s");
            bench_emit(opts, c, g_subjects[s].name, "ns_per_op", bench_summarize(ns, k), "ns");
            bench_emit(opts, c, g_subjects[s].name, "cpu_ns_per_op", bench_summarize(cpu, k), "ns");
            if (r[s][0][w].have_counts) {
                /* counts of the median run would need sorting; they vary
                 * little between runs: the first run's */
                bench_emit_counts(opts, c, g_subjects[s].name, &r[s][0][w].counts);
            }
            if (g_subjects[s].pool || g_subjects[s].counts) {
                double me = median_ops(r[s], runs, w);
                if (lmdb >= 0 && ran[lmdb] && median_ops(r[lmdb], runs, w) > 0)
                    bench_emit(opts, c, g_subjects[s].name, "vs_lmdb",
                               bench_exact(me / median_ops(r[lmdb], runs, w)), "x");
                if (rocks >= 0 && ran[rocks] && median_ops(r[rocks], runs, w) > 0)
                    bench_emit(opts, c, g_subjects[s].name, "vs_rocksdb",
                               bench_exact(me / median_ops(r[rocks], runs, w)), "x");
                /* the same ratios by CPU time (see cpu_now_ns) */
                double mc = median_ops_by(r[s], runs, w, true);
                if (lmdb >= 0 && ran[lmdb] && median_ops_by(r[lmdb], runs, w, true) > 0)
                    bench_emit(opts, c, g_subjects[s].name, "cpu_vs_lmdb",
                               bench_exact(mc / median_ops_by(r[lmdb], runs, w, true)), "x");
                if (rocks >= 0 && ran[rocks] && median_ops_by(r[rocks], runs, w, true) > 0)
                    bench_emit(opts, c, g_subjects[s].name, "cpu_vs_rocksdb",
                               bench_exact(mc / median_ops_by(r[rocks], runs, w, true)), "x");
            }
        }
    }
}

int main(int argc, char **argv)
{
    bench_opts opts;
    bench_parse(&opts, &info, argc, argv);
    uint64_t n = opts.quick ? 20000 : 1000000;
    const char *values = "100,1024", *threads_list = "1,2", *subjects = NULL;
    for (int i = 0; i < opts.argc; i++) {
        const char *a = opts.argv[i];
        if (i + 1 >= opts.argc) bench_usage_error(&opts, "unknown option or missing value: %s", a);
        const char *v = opts.argv[++i];
        if (!strcmp(a, "--keys")) {
            n = strtoull(v, NULL, 0);
            if (n < 100 || n > (1ull << 31)) bench_usage_error(&opts, "--keys: 100 .. 2^31");
        } else if (!strcmp(a, "--values")) {
            values = v;
        } else if (!strcmp(a, "--threads")) {
            threads_list = v;
        } else if (!strcmp(a, "--subjects")) {
            subjects = v;
        } else if (!strcmp(a, "--workloads")) {
            g_workloads = v;
        } else {
            bench_usage_error(&opts, "unknown option: %s", a);
        }
    }
#ifdef NVH_BENCH_PMDK
    if (!opts.child) return bench_run_pmem_forced(&opts);
    pmdk_count_init("bench_kv");
#else
    bench_note(&opts, "pmdk: not measured (libpmemobj-dev and its examples were not found when "
               "this was built)");
#endif
#ifndef NVH_BENCH_LMDB
    bench_note(&opts, "lmdb: not measured (liblmdb-dev was not found when this was built)");
#endif
#ifndef NVH_BENCH_ROCKSDB
    bench_note(&opts, "rocksdb: not measured (librocksdb-dev was not found when this was built)");
#endif
    bench_note(&opts, "%llu keys of %d random bytes; nvheap: pmem domain on %s (%s), prefaulted; "
               "LMDB and RocksDB on the same directory, every write synced; runs %u",
               (unsigned long long)n, KEY_LEN, opts.dir,
               nvh_flush_kind_name(nvh_flush_kind_detect()), opts.runs);
    keyset ks;
    keyset_make(&ks, n);
    unsigned runs = opts.runs > MAX_RUNS ? MAX_RUNS : opts.runs;
    bool ran[NSUB];
    for (size_t s = 0; s < NSUB; s++) ran[s] = list_has(subjects, g_subjects[s].name);
    static measured r[NSUB][MAX_RUNS][W_COUNT];
    for (const char *vp = values; vp && *vp; vp = strchr(vp, ',') ? strchr(vp, ',') + 1 : NULL) {
        size_t vlen = (size_t)strtoull(vp, NULL, 0);
        for (const char *tp = threads_list; tp && *tp;
             tp = strchr(tp, ',') ? strchr(tp, ',') + 1 : NULL) {
            unsigned threads = (unsigned)strtoul(tp, NULL, 0);
            if (threads < 1 || threads > MAX_THREADS)
                bench_usage_error(&opts, "--threads: 1 .. %d", MAX_THREADS);
            memset(r, 0, sizeof r);
            for (unsigned i = 0; i < runs; i++)
                for (size_t s = 0; s < NSUB; s++)
                    if (ran[s]) run_subject(&opts, &g_subjects[s], &ks, vlen, threads, r[s][i]);
            report(&opts, vlen, threads, runs, r, ran);
        }
    }
    keyset_free(&ks);
    return bench_finish(&opts);
}
