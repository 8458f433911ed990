/* kv.c — the key-value store's life cycle: configuration, the store
 * directory (one named object "nvh.kv.<name>" per store holding its
 * descriptor), create / open / close, list, drop, statistics and check.
 * Operations are in kv_ops.c, batches in kv_batch.c, iterators in
 * kv_iter.c. User guide: docs/KV.md; format: docs/FORMAT.md. */
#include "kv.h"
#include "../protect/protect.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KV_DEFAULT_LAYOUT "nvkv"
#define KV_DEFAULT_NAME "default"
#define KV_DEFAULT_SIZE ((uint64_t)64 << 20)

static const char *kv_engine_name(uint32_t e)
{
    return e == KV_ENGINE_SORTED ? "sorted" : e == KV_ENGINE_HASH ? "hash" : "unknown";
}

/* The named object of a store: "nvh.kv." + name (7 + 32 <= NVH_NAME_MAX). */
static int kv_obj_name(const char *fn, const char *name, char out[NVH_NAME_MAX + 1])
{
    size_t n = strlen(name);
    if (n == 0) return nvh_fail(NVH_E_INVAL, "%s: empty store name", fn);
    if (n > NVH_KV_NAME_MAX)
        return nvh_fail(NVH_E_TOOLONG, "%s: store name '%.40s...' of %zu bytes exceeds "
                        "NVH_KV_NAME_MAX (%u)", fn, name, n, NVH_KV_NAME_MAX);
    snprintf(out, NVH_NAME_MAX + 1, NVH_KV_OBJ_PREFIX "%s", name);
    return NVH_OK;
}

/* A descriptor read from the pool: its object must be large enough, and its
 * fixed words valid (checksum, magic, version, engine). Never trusts it
 * further: the engine validates the root, the batch code the log. */
static int kv_desc_validate(const char *fn, const char *name, const struct kv_desc *d,
                            size_t size, nvh_off_t off)
{
    if (size < sizeof *d)
        return nvh_fail(NVH_E_CORRUPT, "%s: store '%s': descriptor at offset %llu is %zu "
                        "bytes (expected %zu)", fn, name, (unsigned long long)off, size,
                        sizeof *d);
    if (d->magic != NVH_KV_DESC_MAGIC || d->check != kv_desc_crc(d))
        return nvh_fail(NVH_E_CORRUPT, "%s: store '%s': descriptor at offset %llu fails its "
                        "%s", fn, name, (unsigned long long)off,
                        d->magic != NVH_KV_DESC_MAGIC ? "magic" : "checksum");
    if (d->version != NVH_KV_DESC_VERSION)
        return nvh_fail(NVH_E_VERSION, "%s: store '%s': descriptor version %u (this library: "
                        "%u)", fn, name, d->version, NVH_KV_DESC_VERSION);
    if (d->engine != KV_ENGINE_SORTED && d->engine != KV_ENGINE_HASH)
        return nvh_fail(NVH_E_CORRUPT, "%s: store '%s': descriptor at offset %llu names "
                        "engine %u", fn, name, (unsigned long long)off, d->engine);
    if ((d->root && (d->root % NVH_ALLOC_ALIGN)) || (d->batch && (d->batch % NVH_ALLOC_ALIGN)))
        return nvh_fail(NVH_E_CORRUPT, "%s: store '%s': descriptor at offset %llu holds a "
                        "misaligned link", fn, name, (unsigned long long)off);
    return NVH_OK;
}

/* ==========================================================================
 * Create and open
 * ========================================================================== */
/* The descriptor first (named, engine root 0), then the engine with the
 * descriptor's root word as its link: a crash in between leaves a
 * descriptor with root 0, which the next writable open finishes the same
 * way (kv_finish_create). */
static struct kv_desc *kv_desc_create(nvh_pool *pool, const char *fn, const char *name,
                                      const char *obj, uint32_t engine, uint32_t flags)
{
    struct kv_desc *d = nvh_reserve_named(pool, obj, sizeof *d);
    if (!d) {
        nvh_fail_context(nvh_errcode(), "%s: store '%s'", fn, name);
        return NULL;
    }
    memset(d, 0, sizeof *d);
    d->magic = NVH_KV_DESC_MAGIC;
    d->version = NVH_KV_DESC_VERSION;
    d->engine = engine;
    d->flags = flags;
    d->check = kv_desc_crc(d);
    nvh_persist(pool, d, sizeof *d);
    int rc = nvh_activate_named(pool, obj);
    if (rc != NVH_OK) {
        nvh_fail_context(rc, "%s: store '%s'", fn, name);
        return NULL;
    }
    return d;
}

static int kv_finish_create(nvh_pool *pool, struct kv_desc *d, const char *fn, const char *name)
{
    int rc = d->engine == KV_ENGINE_HASH ? nvh_hmap_create(pool, &d->root, NULL)
                                         : kv_sorted_create(pool, &d->root);
    if (rc != NVH_OK) return nvh_fail_context(rc, "%s: store '%s': creating the %s engine", fn,
                                              name, kv_engine_name(d->engine));
    return NVH_OK;
}

static int kv_hook_close(nvh_pool_hook *hook, int check_only);

static int kv_parse_engine(const char *fn, const char *engine, uint32_t *out)
{
    if (!engine) *out = 0;
    else if (strcmp(engine, "sorted") == 0) *out = KV_ENGINE_SORTED;
    else if (strcmp(engine, "hash") == 0) *out = KV_ENGINE_HASH;
    else return nvh_fail(NVH_E_INVAL, "%s: engine '%s' (expected \"sorted\" or \"hash\")", fn,
                         engine);
    return NVH_OK;
}

static nvh_kv *kv_open_in(nvh_pool *pool, const nvh_kv_config *c, bool own_pool, const char *fn)
{
    const char *name = c->name ? c->name : KV_DEFAULT_NAME;
    char obj[NVH_NAME_MAX + 1];
    uint32_t want_engine = 0;
    if (kv_obj_name(fn, name, obj) != NVH_OK) return NULL;
    if (kv_parse_engine(fn, c->engine, &want_engine) != NVH_OK) return NULL;
    if ((unsigned)c->create > NVH_KV_CREATE_NEW) {
        nvh_fail(NVH_E_INVAL, "%s: create mode %d", fn, (int)c->create);
        return NULL;
    }
    if (c->flags & ~NVH_KV_READONLY) {
        nvh_fail(NVH_E_INVAL, "%s: unknown flags 0x%x", fn, c->flags & ~NVH_KV_READONLY);
        return NULL;
    }
    bool readonly = (c->flags & NVH_KV_READONLY) || pool->readonly;

    size_t size = 0;
    struct kv_desc *d = nvh_get_named(pool, obj, &size);
    if (!d && nvh_errcode() != NVH_E_NOTFOUND) {
        nvh_fail_context(nvh_errcode(), "%s: store '%s'", fn, name);
        return NULL;
    }
    if (d && c->create == NVH_KV_CREATE_NEW) {
        nvh_fail(NVH_E_EXISTS, "%s: store '%s' exists already", fn, name);
        return NULL;
    }
    if (!d) {
        if (c->create == NVH_KV_OPEN_EXISTING) {
            nvh_fail(NVH_E_NOTFOUND, "%s: no store '%s' in the pool", fn, name);
            return NULL;
        }
        if (readonly) {
            nvh_fail(NVH_E_READONLY, "%s: store '%s' does not exist and the pool is read-only",
                     fn, name);
            return NULL;
        }
        uint32_t engine = want_engine ? want_engine : KV_ENGINE_SORTED;
        if (c->cmp && engine != KV_ENGINE_SORTED) {
            nvh_fail(NVH_E_INVAL, "%s: store '%s': a comparator needs the sorted engine", fn,
                     name);
            return NULL;
        }
        d = kv_desc_create(pool, fn, name, obj, engine, c->cmp ? KV_DESC_CUSTOM_ORDER : 0);
        if (!d) return NULL;
        size = sizeof *d;
    }
    nvh_off_t doff = nvh_off(pool, d);
    if (kv_desc_validate(fn, name, d, size, doff) != NVH_OK) return NULL;
    if (want_engine && want_engine != d->engine) {
        nvh_fail(NVH_E_INVAL, "%s: store '%s' uses the %s engine, not %s", fn, name,
                 kv_engine_name(d->engine), kv_engine_name(want_engine));
        return NULL;
    }
    if (d->engine == KV_ENGINE_HASH && c->cmp) {
        nvh_fail(NVH_E_INVAL, "%s: store '%s' uses the hash engine: no comparator", fn, name);
        return NULL;
    }
    if (d->engine == KV_ENGINE_SORTED && !!c->cmp != !!(d->flags & KV_DESC_CUSTOM_ORDER)) {
        nvh_fail(NVH_E_INVAL, "%s: store '%s' was built with %s order: %s", fn, name,
                 c->cmp ? "bytewise" : "a custom", c->cmp ? "give no comparator"
                                                          : "give its comparator");
        return NULL;
    }

    /* An open store: the same handle, a reference more. */
    nvh_pool_hook *open = nvh_pool_hook_get_(pool, d);
    if (open) return (nvh_kv *)(void *)((char *)open - offsetof(nvh_kv, hook));

    if (d->root == 0) {
        if (readonly) {
            nvh_fail(NVH_E_READONLY, "%s: store '%s': creation was interrupted and the pool "
                     "is read-only", fn, name);
            return NULL;
        }
        if (kv_finish_create(pool, d, fn, name) != NVH_OK) return NULL;
    }
    /* aligned: one line per counter stripe */
    nvh_kv *kv = aligned_alloc(64, NVH_ALIGN_UP(sizeof(nvh_kv), (size_t)64));
    if (kv) memset(kv, 0, sizeof *kv);
    if (!kv) {
        nvh_fail(NVH_E_NOMEM, "%s: out of memory", fn);
        return NULL;
    }
    kv->pool = pool;
    kv->own_pool = own_pool;
    kv->readonly = readonly;
    kv->engine = (enum kv_engine_id)d->engine;
    kv->desc = d;
    snprintf(kv->name, sizeof kv->name, "%s", name);
    pthread_rwlock_init(&kv->wlock, NULL);
    if (kv->engine == KV_ENGINE_HASH) kv->hm = nvh_hmap_open(pool, d->root);
    else kv->st = kv_sorted_open(pool, d->root, c->cmp, c->cmp_arg);
    if (!kv->hm && !kv->st) {
        /* a root the engine refuses is a damaged descriptor (or engine) */
        int code = nvh_errcode();
        if (code != NVH_E_NOMEM && code != NVH_E_NOTSUP && code != NVH_E_IO) code = NVH_E_CORRUPT;
        nvh_fail_context(code, "%s: store '%s': opening the %s engine at offset %llu",
                         fn, name, kv_engine_name(d->engine), (unsigned long long)d->root);
        goto fail;
    }
    /* A batch committed but not applied when the pool last closed. */
    if (d->batch) {
        if (readonly) {
            nvh_fail(NVH_E_READONLY, "%s: store '%s' has a committed batch to finish and the "
                     "pool is read-only (open it writable once)", fn, name);
            goto fail;
        }
        if (nvh_kv_batch_replay_(kv) != NVH_OK) {    /* its message names the store */
            nvh_fail_context(nvh_errcode(), "%s", fn);
            goto fail;
        }
    }
    kv->hook.key = d;
    kv->hook.close = kv_hook_close;
    nvh_pool_hook *got = nvh_pool_hook_add_(pool, &kv->hook);
    if (got != &kv->hook) {           /* another thread opened it meanwhile */
        if (kv->hm) nvh_hmap_close(kv->hm);
        if (kv->st) kv_sorted_close(kv->st);
        pthread_rwlock_destroy(&kv->wlock);
        free(kv);
        return (nvh_kv *)(void *)((char *)got - offsetof(nvh_kv, hook));
    }
    return kv;
fail:
    if (kv->hm) nvh_hmap_close(kv->hm);
    if (kv->st) kv_sorted_close(kv->st);
    pthread_rwlock_destroy(&kv->wlock);
    free(kv);
    return NULL;
}

nvh_kv *nvh_kv_open_pool(nvh_pool *pool, const nvh_kv_config *config)
{
    if (!pool || !config) {
        nvh_fail(NVH_E_INVAL, "nvh_kv_open_pool: NULL pool or config");
        return NULL;
    }
    nvh_protect_internal_begin(pool);
    nvh_kv *kv = kv_open_in(pool, config, false, "nvh_kv_open_pool");
    nvh_protect_internal_end(pool);
    return kv;
}

nvh_kv *nvh_kv_open(const nvh_kv_config *config)
{
    const char *fn = "nvh_kv_open";
    if (!config || !config->path) {
        nvh_fail(NVH_E_INVAL, "%s: NULL config or path", fn);
        return NULL;
    }
    const char *layout = config->layout ? config->layout : KV_DEFAULT_LAYOUT;
    bool ro = config->flags & NVH_KV_READONLY;
    unsigned pflags = ro ? NVH_OPEN_READONLY : 0;
    nvh_pool *pool = NULL;
    if (config->create != NVH_KV_OPEN_EXISTING && !ro && access(config->path, F_OK) != 0 &&
        errno == ENOENT) {
        nvh_pool_options o = {.max_size = config->max_size};
        pool = nvh_pool_create_ex(config->path, layout,
                                  config->size ? config->size : KV_DEFAULT_SIZE, pflags, &o);
        if (!pool && nvh_errcode() != NVH_E_EXISTS) return NULL;   /* lost a race: open */
    }
    if (!pool) pool = nvh_pool_open(config->path, layout, pflags);
    if (!pool) return NULL;
    nvh_protect_internal_begin(pool);
    nvh_kv *kv = kv_open_in(pool, config, true, fn);
    nvh_protect_internal_end(pool);
    if (!kv) {
        nvh_err_saved e;
        nvh_err_save(&e);
        nvh_pool_close(pool);
        nvh_err_restore(&e);
        return NULL;
    }
    return kv;
}

/* ==========================================================================
 * Close
 * ========================================================================== */
static void kv_free(nvh_kv *kv)
{
    pthread_rwlock_destroy(&kv->wlock);
    free(kv);
}

int nvh_kv_close(nvh_kv *kv)
{
    if (!kv) return NVH_OK;
    nvh_pool *pool = kv->pool;
    if (nvh_pool_hook_del_(pool, &kv->hook) > 0) return NVH_OK;   /* opened again */
    int rc = NVH_OK;
    if (kv->hm) rc = nvh_hmap_close(kv->hm);
    if (kv->st) {
        int rc2 = kv_sorted_close(kv->st);
        if (rc == NVH_OK) rc = rc2;
    }
    bool own = kv->own_pool;
    kv_free(kv);
    if (own) {
        int rc2 = nvh_pool_close(pool);
        if (rc == NVH_OK) rc = rc2;
    }
    return rc;
}

/* nvh_pool_close with the store still open: every write was durable when
 * it returned. A hash map is closed by its own hook (it is in the same
 * list, and may come after this one); the sorted engine has none, so it is
 * closed here. */
static int kv_hook_close(nvh_pool_hook *hook, int check_only)
{
    if (check_only) return NVH_OK;
    nvh_kv *kv = (nvh_kv *)(void *)((char *)hook - offsetof(nvh_kv, hook));
    int rc = kv->st ? kv_sorted_close(kv->st) : NVH_OK;
    kv_free(kv);
    return rc;
}

nvh_pool *nvh_kv_pool(nvh_kv *kv) { return kv ? kv->pool : NULL; }

const char *nvh_kv_engine(const nvh_kv *kv) { return kv ? kv_engine_name(kv->engine) : NULL; }

/* ==========================================================================
 * The store directory: list and drop
 * ========================================================================== */
typedef struct kv_list_ctx {
    int (*fn)(const char *name, const char *engine, void *arg);
    void *arg;
    nvh_pool *pool;
    bool damaged;
} kv_list_ctx;

static int kv_list_one(const char *obj, void *ptr, size_t size, void *arg)
{
    kv_list_ctx *c = arg;
    size_t plen = strlen(NVH_KV_OBJ_PREFIX);
    if (strncmp(obj, NVH_KV_OBJ_PREFIX, plen) != 0) return 0;
    const char *name = obj + plen;
    const struct kv_desc *d = ptr;
    if (kv_desc_validate("nvh_kv_list", name, d, size, nvh_off(c->pool, ptr)) != NVH_OK) {
        c->damaged = true;
        return 0;
    }
    return c->fn(name, kv_engine_name(d->engine), c->arg);
}

int nvh_kv_list(nvh_pool *pool, int (*fn)(const char *name, const char *engine, void *arg),
                void *arg)
{
    if (!pool || !fn) return nvh_fail(NVH_E_INVAL, "nvh_kv_list: NULL pool or function");
    kv_list_ctx c = {fn, arg, pool, false};
    int rc = nvh_named_foreach(pool, kv_list_one, &c);
    if (rc != NVH_OK) return rc;
    if (c.damaged) return nvh_fail(NVH_E_CORRUPT, "nvh_kv_list: a store descriptor failed "
                                   "validation (skipped)");
    return NVH_OK;
}

/* Drop: the batch log (if any) unapplied, the engine's data (each step
 * failure-atomic; the engine clears desc.root), then the descriptor. A
 * crash before the descriptor is freed leaves a store with less data, or
 * none (root 0: the next open makes it empty again). */
static int kv_drop(nvh_pool *pool, const char *name)
{
    const char *fn = "nvh_kv_drop";
    char obj[NVH_NAME_MAX + 1];
    int rc = kv_obj_name(fn, name, obj);
    if (rc != NVH_OK) return rc;
    if (pool->readonly) return nvh_fail(NVH_E_READONLY, "%s: store '%s': pool is read-only", fn,
                                        name);
    size_t size = 0;
    struct kv_desc *d = nvh_get_named(pool, obj, &size);
    if (!d) {
        if (nvh_errcode() == NVH_E_NOTFOUND)
            return nvh_fail(NVH_E_NOTFOUND, "%s: no store '%s' in the pool", fn, name);
        return nvh_fail_context(nvh_errcode(), "%s: store '%s'", fn, name);
    }
    nvh_pool_hook *open = nvh_pool_hook_get_(pool, d);
    if (open) {
        nvh_pool_hook_del_(pool, open);
        return nvh_fail(NVH_E_BUSY, "%s: store '%s' is open", fn, name);
    }
    rc = kv_desc_validate(fn, name, d, size, nvh_off(pool, d));
    if (rc != NVH_OK) return rc;
    if (d->batch) {
        void *log = nvh_ptr(pool, d->batch);
        nvh_link l = {&d->batch, 0};
        rc = nvh_free(pool, log, &l, 1);
        if (rc != NVH_OK) return nvh_fail_context(rc, "%s: store '%s': freeing its batch log",
                                                  fn, name);
    }
    if (d->root) {
        if (d->engine == KV_ENGINE_HASH) {
            nvh_hmap *m = nvh_hmap_open(pool, d->root);
            rc = m ? nvh_hmap_destroy(m, &d->root) : nvh_errcode();
            if (m && rc != NVH_OK) nvh_hmap_close(m);
        } else {
            kv_sorted *t = kv_sorted_open(pool, d->root, NULL, NULL);
            rc = t ? kv_sorted_destroy(t, &d->root) : nvh_errcode();
            if (t && rc != NVH_OK) kv_sorted_close(t);
        }
        if (rc != NVH_OK) return nvh_fail_context(rc, "%s: store '%s': freeing its data", fn,
                                                  name);
    }
    rc = nvh_free_named(pool, obj);
    if (rc != NVH_OK) return nvh_fail_context(rc, "%s: store '%s'", fn, name);
    return NVH_OK;
}

int nvh_kv_drop(nvh_pool *pool, const char *name)
{
    if (!pool || !name) return nvh_fail(NVH_E_INVAL, "nvh_kv_drop: NULL pool or name");
    nvh_protect_internal_begin(pool);
    int rc = kv_drop(pool, name);
    nvh_protect_internal_end(pool);
    return rc;
}

/* ==========================================================================
 * Statistics and check
 * ========================================================================== */
static int kv_bytes_fn(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    (void)k, (void)v;
    nvh_kv_stats *s = arg;
    s->key_bytes += kl;
    s->value_bytes += vl;
    return 0;
}

#ifdef NVH_TEST_HOOKS
_Atomic unsigned long nvh_kv_test_bytes_walks_;
#endif

/* Key and value bytes of a hash store: the map keeps their change since
 * open; one walk with writers kept out (the write lock: single writes hold
 * it shared, batches exclusive) sets the base, so every later call is O(1). */
static int kv_hash_bytes(nvh_kv *kv, uint64_t *kbytes, uint64_t *vbytes)
{
    int64_t dk, dv;
    if (!__atomic_load_n(&kv->hbytes_known, __ATOMIC_ACQUIRE)) {
        pthread_rwlock_wrlock(&kv->wlock);
        if (!kv->hbytes_known) {
            nvh_kv_stats w = {0};
#ifdef NVH_TEST_HOOKS
            nvh_kv_test_bytes_walks_++;
#endif
            int rc = nvh_kv_get_all(kv, kv_bytes_fn, &w);
            if (rc != NVH_OK) {
                pthread_rwlock_unlock(&kv->wlock);
                return rc;
            }
            nvh_hm_bytes_delta_(kv->hm, &dk, &dv);
            kv->hkbase = (int64_t)w.key_bytes - dk;
            kv->hvbase = (int64_t)w.value_bytes - dv;
            __atomic_store_n(&kv->hbytes_known, 1, __ATOMIC_RELEASE);
        }
        pthread_rwlock_unlock(&kv->wlock);
    }
    nvh_hm_bytes_delta_(kv->hm, &dk, &dv);
    *kbytes = (uint64_t)(kv->hkbase + dk);
    *vbytes = (uint64_t)(kv->hvbase + dv);
    return NVH_OK;
}

int nvh_kv_stats_get(nvh_kv *kv, nvh_kv_stats *s)
{
    if (!kv || !s) return nvh_fail(NVH_E_INVAL, "nvh_kv_stats_get: NULL store or stats");
    memset(s, 0, sizeof *s);
    int rc = nvh_kv_count_all(kv, &s->count);
    if (rc != NVH_OK) return rc;
    /* key and value bytes: both engines keep them as counters (their
     * writers know the old entry's lengths from their lookup), exact after
     * one walk per open that no writer may overlap (the write lock, once) */
    if (kv->st) {
        bool walk = !kv_sorted_bytes_known(kv->st);
        if (walk) pthread_rwlock_wrlock(&kv->wlock);
        rc = kv_sorted_bytes(kv->st, &s->key_bytes, &s->value_bytes);
        if (walk) pthread_rwlock_unlock(&kv->wlock);
        if (rc != NVH_OK) return nvh_fail_context(rc, "nvh_kv_stats_get: store '%s'", kv->name);
    } else {
        rc = kv_hash_bytes(kv, &s->key_bytes, &s->value_bytes);
        if (rc != NVH_OK) return rc;
    }
    s->pool_size = nvh_pool_size(kv->pool);
    nvh_heap_stats hs;
    if (nvh_heap_stats_get(kv->pool, &hs) == NVH_OK) s->pool_used = hs.live_bytes;
    for (unsigned i = 0; i < NVH_STAT_STRIPES; i++) {
        s->puts += atomic_load_explicit(&kv->ctr[i].puts, memory_order_relaxed);
        s->gets += atomic_load_explicit(&kv->ctr[i].gets, memory_order_relaxed);
        s->removes += atomic_load_explicit(&kv->ctr[i].removes, memory_order_relaxed);
        s->batches += atomic_load_explicit(&kv->ctr[i].batches, memory_order_relaxed);
    }
    nvh_stats ps;
    nvh_stats_get(kv->pool, &ps);
    s->flushes = ps.lines_flushed;
    s->fences = ps.fences;
    return NVH_OK;
}

int nvh_kv_check(nvh_kv *kv)
{
    if (!kv) return nvh_fail(NVH_E_INVAL, "nvh_kv_check: NULL store");
    struct kv_desc *d = kv->desc;
    int rc = kv_desc_validate("nvh_kv_check", kv->name, d, sizeof *d, nvh_off(kv->pool, d));
    if (rc != NVH_OK) return rc;
    if (kv->hm) {
        nvh_hmap_stats st;
        nvh_protect_internal_begin(kv->pool);
        rc = nvh_hmap_check(kv->hm, &st);
        nvh_protect_internal_end(kv->pool);
    } else {
        /* the engine's check compares the leaves with their DRAM state:
         * no writer may run meanwhile */
        pthread_rwlock_wrlock(&kv->wlock);
        rc = kv_sorted_check(kv->st);
        pthread_rwlock_unlock(&kv->wlock);
    }
    if (rc != NVH_OK) return nvh_fail_context(rc, "nvh_kv_check: store '%s'", kv->name);
    return NVH_OK;
}
