/* cmd_stat.c — `nvheap ls` and `nvheap stat`: what a pool holds, and its
 * allocator and store statistics.
 *
 * Both open the pool read-only without a lock (NVH_OPEN_SHARED), so they
 * work while an application has the pool open read-write, as mdb_stat does
 * for LMDB, and never keep that application's next open out. They read the
 * live pool: a walk that meets another process's update half done fails
 * with NVH_E_CORRUPT and is tried again (a few times) before it is
 * reported. docs/CLI.md documents the output. */
#include "cli.h"
#include "kv/kv.h"           /* store descriptor: the engine root an ls attributes */

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WALK_TRIES 3

/* The pool, read-only and unlocked. The domain is named so that an
 * NVHEAP_DOMAIN=sim environment (read-write only) does not refuse it. */
static nvh_pool *open_shared(const char *path)
{
    return nvh_pool_open(path, NULL, NVH_OPEN_READONLY | NVH_OPEN_SHARED | NVH_DOMAIN_PROCESS);
}

static void pause_briefly(void)
{
    struct timespec ts = {0, 2000000};   /* 2 ms: let the writer finish its update */
    nanosleep(&ts, NULL);
}

/* ==========================================================================
 * Key-value stores: name, engine, entries and bytes (one walk)
 * ========================================================================== */
struct store_info {
    char name[NVH_KV_NAME_MAX + 1];
    char engine[16];
    uint64_t entries, key_bytes, value_bytes, max_key, max_value;
    nvh_off_t root;          /* engine root (a hash store's map), 0 if unknown */
    int rc;                  /* NVH_OK, or why the numbers are missing */
    char error[256];
};

struct store_list {
    struct store_info *v;
    size_t n, cap;
    bool oom;
};

static int collect_store(const char *name, const char *engine, void *arg)
{
    struct store_list *l = arg;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        struct store_info *v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->oom = true;
            return 1;
        }
        l->v = v;
        l->cap = cap;
    }
    struct store_info *s = &l->v[l->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->engine, sizeof s->engine, "%s", engine);
    return 0;
}

static int sum_entry(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    (void)k; (void)v;
    struct store_info *s = arg;
    s->entries++;
    s->key_bytes += kl;
    s->value_bytes += vl;
    if (kl > s->max_key) s->max_key = kl;
    if (vl > s->max_value) s->max_value = vl;
    return 0;
}

static void store_walk(nvh_pool *pool, struct store_info *s)
{
    char obj[NVH_NAME_MAX + 1];
    snprintf(obj, sizeof obj, NVH_KV_OBJ_PREFIX "%s", s->name);
    size_t size = 0;
    const struct kv_desc *d = nvh_get_named(pool, obj, &size);
    if (d && size >= sizeof *d) s->root = d->root;
    for (int attempt = 0; attempt < WALK_TRIES; attempt++) {
        if (attempt) pause_briefly();
        nvh_kv_config c = {.name = s->name, .flags = NVH_KV_READONLY};
        nvh_kv *kv = nvh_kv_open_pool(pool, &c);
        s->rc = NVH_OK;
        s->entries = s->key_bytes = s->value_bytes = s->max_key = s->max_value = 0;
        if (!kv) {
            s->rc = nvh_errcode();
        } else {
            s->rc = nvh_kv_get_all(kv, sum_entry, s);
            nvh_kv_close(kv);
        }
        if (s->rc == NVH_OK) return;
        snprintf(s->error, sizeof s->error, "%s", nvh_errormsg());
        if (s->rc != NVH_E_CORRUPT) return;
    }
}

static bool stores_get(nvh_pool *pool, struct store_list *l, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    int rc = nvh_kv_list(pool, collect_store, l);
    if (l->oom) {
        snprintf(err, errlen, "out of memory listing the stores");
        return false;
    }
    /* a damaged descriptor is skipped by nvh_kv_list: say so, show the rest */
    if (rc != NVH_OK) snprintf(err, errlen, "%s", nvh_errormsg());
    for (size_t i = 0; i < l->n; i++) store_walk(pool, &l->v[i]);
    return true;
}

/* ==========================================================================
 * ls
 * ========================================================================== */
struct named_list {
    struct { char name[NVH_NAME_MAX + 1]; uint64_t size; } *v;
    size_t n, cap;
    bool oom;
};

static int collect_named(const char *name, void *ptr, size_t size, void *arg)
{
    (void)ptr;
    struct named_list *l = arg;
    /* the descriptors of stores and trees are listed as those */
    if (strncmp(name, NVH_KV_OBJ_PREFIX, strlen(NVH_KV_OBJ_PREFIX)) == 0 ||
        strncmp(name, TREE_PREFIX, strlen(TREE_PREFIX)) == 0)
        return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        void *v = realloc(l->v, cap * sizeof *l->v);
        if (!v) {
            l->oom = true;
            return 1;
        }
        l->v = v;
        l->cap = cap;
    }
    snprintf(l->v[l->n].name, sizeof l->v[l->n].name, "%s", name);
    l->v[l->n++].size = size;
    return 0;
}

struct tree_sum { uint64_t entries, bytes; };

static int sum_tree(uint64_t key, const void *value, size_t len, void *arg)
{
    (void)key; (void)value;
    struct tree_sum *t = arg;
    t->entries++;
    t->bytes += sizeof key + len;
    return 0;
}

/* One row of the text table, or one object of the JSON. */
static void ls_row(struct emitter *e, const char *kind, const char *name, const char *engine,
                   bool have_entries, uint64_t entries, uint64_t bytes, const char *detail)
{
    if (e->json) {
        emit_open(e, name);
        if (engine) emit_str(e, "engine", engine);
        if (have_entries) emit_u64(e, "entries", entries);
        emit_u64(e, "bytes", bytes);
        if (detail && *detail) emit_str(e, "detail", detail);
        emit_close(e);
        return;
    }
    char count[24] = "-";
    if (have_entries) snprintf(count, sizeof count, "%llu", (unsigned long long)entries);
    printf("%-7s %-32s %12s %14llu  %s\n", kind, name, count, (unsigned long long)bytes,
           detail ? detail : "");
}

int run_ls(const struct args *args)
{
    nvh_pool *pool = open_shared(args->path);
    if (!pool) return fail_lib();
    struct emitter e = {.out = stdout, .json = args->given[OPT_JSON]};
    int status = EXIT_OK;
    char err[512] = "";
    struct store_list stores;
    struct containers k;
    struct named_list named = {0};
    bool have_containers = find_containers(pool, &k);
    int nrc = nvh_named_foreach(pool, collect_named, &named);
    if (!stores_get(pool, &stores, err, sizeof err) || !have_containers || named.oom) {
        status = fail_msg("%s: out of memory", args->path);
        goto out;
    }

    emit_begin(&e);
    if (!e.json)
        printf("%-7s %-32s %12s %14s  %s\n", "KIND", "NAME", "ENTRIES", "BYTES", "DETAIL");
    char detail[320];
    /* stores: bytes = keys + values */
    if (e.json) emit_open(&e, "stores");
    for (size_t i = 0; i < stores.n; i++) {
        const struct store_info *s = &stores.v[i];
        if (s->rc == NVH_OK)
            snprintf(detail, sizeof detail, "engine %s, keys %llu B, values %llu B", s->engine,
                     (unsigned long long)s->key_bytes, (unsigned long long)s->value_bytes);
        else
            snprintf(detail, sizeof detail, "engine %s, error: %s", s->engine, s->error);
        ls_row(&e, "store", s->name, s->engine, s->rc == NVH_OK, s->entries,
               s->key_bytes + s->value_bytes, detail);
    }
    if (e.json) emit_close(&e);
    /* B+ trees (uint64_t keys): bytes = 8 per key + values */
    if (e.json) emit_open(&e, "trees");
    for (unsigned i = 0; i < k.ntrees; i++) {
        struct tree_sum t = {0, 0};
        nvh_btree_options o = {.mode = NVH_BTREE_FLUSH};
        nvh_btree *tree = nvh_btree_open(pool, k.trees[i], 0, &o);
        int rc = tree ? nvh_btree_scan(tree, 0, UINT64_MAX, sum_tree, &t) : nvh_errcode();
        snprintf(detail, sizeof detail, "%s%s", rc == NVH_OK ? "B+ tree" : "error: ",
                 rc == NVH_OK ? "" : nvh_errormsg());
        if (tree) nvh_btree_close(tree);
        ls_row(&e, "tree", k.trees[i], NULL, rc == NVH_OK || t.entries, t.entries, t.bytes, detail);
    }
    if (e.json) emit_close(&e);
    /* hash maps not owned by a store, named by their offset */
    if (e.json) emit_open(&e, "maps");
    for (unsigned i = 0; i < k.nmaps; i++) {
        bool owned = false;
        for (size_t j = 0; j < stores.n && !owned; j++) owned = stores.v[j].root == k.maps[i];
        if (owned) continue;
        char name[32];
        snprintf(name, sizeof name, "@%llu", (unsigned long long)k.maps[i]);
        nvh_hmap *m = nvh_hmap_open(pool, k.maps[i]);
        nvh_hmap_stats st;
        memset(&st, 0, sizeof st);
        int rc = m ? nvh_hmap_check(m, &st) : nvh_errcode();
        if (rc == NVH_OK)
            snprintf(detail, sizeof detail, "hash map, %llu buckets",
                     (unsigned long long)st.buckets);
        else
            snprintf(detail, sizeof detail, "error: %s", nvh_errormsg());
        if (m) nvh_hmap_close(m);
        ls_row(&e, "map", name, NULL, rc == NVH_OK, st.count, st.key_bytes + st.value_bytes, detail);
    }
    if (e.json) emit_close(&e);
    /* every other named object: its usable size */
    if (e.json) emit_open(&e, "objects");
    for (size_t i = 0; i < named.n; i++)
        ls_row(&e, "object", named.v[i].name, NULL, false, 0, named.v[i].size, "named object");
    if (e.json) emit_close(&e);
    emit_end(&e);
    if (*err) fprintf(stderr, "nvheap: warning: %s\n", err);
    if (nrc == NVH_E_CORRUPT)
        fprintf(stderr, "nvheap: warning: damaged named-object entries were skipped\n");
out:
    free(stores.v);
    free(named.v);
    free_containers(&k);
    nvh_pool_close(pool);
    if (status == EXIT_OK && fflush(stdout) != 0)
        return fail_msg("cannot write the output: %s", strerror(errno));
    return status;
}

/* ==========================================================================
 * stat
 * ========================================================================== */
int run_stat(const struct args *args)
{
    nvh_pool *pool = open_shared(args->path);
    if (!pool) return fail_lib();
    nvh_pool_info info;
    nvh_pool_info_get(pool, &info);
    nvh_heap_stats hs;
    int hrc = NVH_E_CORRUPT;
    for (int attempt = 0; attempt < WALK_TRIES && hrc == NVH_E_CORRUPT; attempt++) {
        if (attempt) pause_briefly();
        hrc = nvh_heap_stats_get(pool, &hs);
    }
    char herr[512] = "";
    if (hrc != NVH_OK) snprintf(herr, sizeof herr, "%s", nvh_errormsg());
    struct store_list stores;
    char err[512] = "";
    if (!stores_get(pool, &stores, err, sizeof err)) {
        nvh_pool_close(pool);
        return fail_msg("%s: %s", args->path, err);
    }

    struct emitter e = {.out = stdout, .json = args->given[OPT_JSON]};
    char buf[40];
    emit_begin(&e);
    emit_str(&e, "path", args->path);
    emit_str(&e, "layout", info.layout);
    emit_u64(&e, "size", info.size);
    emit_u64(&e, "epoch", info.epoch);
    /* "no" while a read-write open is running, or after its crash */
    emit_str(&e, "closed-cleanly", info.clean_at_open ? "yes" : "no");
    emit_str(&e, "domain", domain_label(info.created_domain, buf));
    emit_u64(&e, "format-version", info.format_version);
    emit_open(&e, "allocator");
    if (hrc == NVH_OK) emit_heap_stats(&hs, &e);
    else emit_str(&e, "error", herr);
    emit_close(&e);
    emit_open(&e, "stores");
    for (size_t i = 0; i < stores.n; i++) {
        const struct store_info *s = &stores.v[i];
        emit_open(&e, s->name);
        emit_str(&e, "engine", s->engine);
        if (s->rc != NVH_OK) {
            emit_str(&e, "error", s->error);
        } else {
            double n = s->entries ? (double)s->entries : 1;
            emit_u64(&e, "entries", s->entries);
            emit_u64(&e, "key-bytes", s->key_bytes);
            emit_u64(&e, "value-bytes", s->value_bytes);
            emit_u64(&e, "max-key", s->max_key);
            emit_u64(&e, "max-value", s->max_value);
            emit_double(&e, "avg-key", (double)s->key_bytes / n, 1);
            emit_double(&e, "avg-value", (double)s->value_bytes / n, 1);
        }
        emit_close(&e);
    }
    emit_close(&e);
    emit_end(&e);
    if (*err) fprintf(stderr, "nvheap: warning: %s\n", err);
    free(stores.v);
    nvh_pool_close(pool);
    return fflush(stdout) == 0 ? EXIT_OK
                               : fail_msg("cannot write the output: %s", strerror(errno));
}
