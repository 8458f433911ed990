/* kv_ops.c — the key-value store's operations: argument checks in the
 * store's terms, put / remove / get / exists, counts and scans, each
 * dispatched to the store's engine (the hash map of src/ds, or the sorted
 * engine of kv/sorted.h). User guide: docs/KV.md. */
#include "kv.h"
#include "../protect/protect.h"

/* ==========================================================================
 * Argument checks
 * ========================================================================== */
int nvh_kv_check_key_(const nvh_kv *kv, const char *fn, const void *key, size_t klen)
{
    if (klen == 0) return nvh_fail(NVH_E_INVAL, "%s: store '%s': empty key (keys are 1..%u "
                                   "bytes)", fn, kv->name, NVH_KV_KEY_MAX);
    if (!key) return nvh_fail(NVH_E_INVAL, "%s: store '%s': NULL key", fn, kv->name);
    if (klen > NVH_KV_KEY_MAX)
        return nvh_fail(NVH_E_TOOLONG, "%s: store '%s': key of %zu bytes exceeds "
                        "NVH_KV_KEY_MAX (%u)", fn, kv->name, klen, NVH_KV_KEY_MAX);
    return NVH_OK;
}

int nvh_kv_check_value_(const nvh_kv *kv, const char *fn, const void *value, size_t vlen)
{
    if (!value && vlen) return nvh_fail(NVH_E_INVAL, "%s: store '%s': NULL value of %zu bytes",
                                        fn, kv->name, vlen);
    if (vlen > NVH_KV_VALUE_MAX)
        return nvh_fail(NVH_E_TOOLONG, "%s: store '%s': value of %zu bytes exceeds "
                        "NVH_KV_VALUE_MAX (%zu)", fn, kv->name, vlen, NVH_KV_VALUE_MAX);
    return NVH_OK;
}

int nvh_kv_check_write_(const nvh_kv *kv, const char *fn)
{
    if (kv->readonly) return nvh_fail(NVH_E_READONLY, "%s: store '%s' is open read-only", fn,
                                      kv->name);
    return NVH_OK;
}

#define KV_CHECK_HANDLE(kv, fn)                                                    \
    do {                                                                           \
        if (!(kv)) return nvh_fail(NVH_E_INVAL, "%s: NULL store", fn);            \
    } while (0)

static int kv_notfound(const nvh_kv *kv, const char *fn)
{
    return nvh_fail(NVH_E_NOTFOUND, "%s: store '%s': key not found", fn, kv->name);
}

/* ==========================================================================
 * Engine dispatch (no lock, no check: single writes and batches share it)
 * ========================================================================== */
int nvh_kv_engine_put_(nvh_kv *kv, const void *key, size_t klen, const void *value,
                       size_t vlen)
{
    if (kv->hm) return nvh_hmap_put(kv->hm, key, klen, value, vlen);
    return kv_sorted_put(kv->st, key, klen, value, vlen);
}

int nvh_kv_engine_remove_(nvh_kv *kv, const void *key, size_t klen)
{
    if (kv->hm) return nvh_hmap_delete(kv->hm, key, klen);
    return kv_sorted_remove(kv->st, key, klen);
}

static int kv_engine_get(nvh_kv *kv, const void *key, size_t klen, kv_entry_fn fn, void *arg)
{
    if (kv->hm) return nvh_hm_get_fn_(kv->hm, key, klen, fn, arg);
    return kv_sorted_get(kv->st, key, klen, fn, arg);
}

/* ==========================================================================
 * Writes
 * ========================================================================== */
int nvh_kv_put(nvh_kv *kv, const void *key, size_t klen, const void *value, size_t vlen)
{
    static const char fn[] = "nvh_kv_put";
    KV_CHECK_HANDLE(kv, fn);
    int rc = nvh_kv_check_key_(kv, fn, key, klen);
    if (rc == NVH_OK) rc = nvh_kv_check_value_(kv, fn, value, vlen);
    if (rc == NVH_OK) rc = nvh_kv_check_write_(kv, fn);
    if (rc != NVH_OK) return rc;
    pthread_rwlock_rdlock(&kv->wlock);
    rc = nvh_kv_engine_put_(kv, key, klen, value, vlen);
    pthread_rwlock_unlock(&kv->wlock);
    if (rc != NVH_OK) return nvh_fail_context(rc, "%s: store '%s'", fn, kv->name);
    kv_tally(kv, KV_CTR_PUTS);
    return NVH_OK;
}

int nvh_kv_remove(nvh_kv *kv, const void *key, size_t klen)
{
    static const char fn[] = "nvh_kv_remove";
    KV_CHECK_HANDLE(kv, fn);
    int rc = nvh_kv_check_key_(kv, fn, key, klen);
    if (rc == NVH_OK) rc = nvh_kv_check_write_(kv, fn);
    if (rc != NVH_OK) return rc;
    pthread_rwlock_rdlock(&kv->wlock);
    rc = nvh_kv_engine_remove_(kv, key, klen);
    pthread_rwlock_unlock(&kv->wlock);
    if (rc == NVH_E_NOTFOUND) return kv_notfound(kv, fn);
    if (rc != NVH_OK) return nvh_fail_context(rc, "%s: store '%s'", fn, kv->name);
    kv_tally(kv, KV_CTR_REMOVES);
    return NVH_OK;
}

/* ==========================================================================
 * Point reads
 * ========================================================================== */
typedef struct kv_copy_ctx {
    void *buf;
    size_t bufsize, vlen;
} kv_copy_ctx;

static int kv_copy_fn(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    (void)k, (void)kl;
    kv_copy_ctx *c = arg;
    c->vlen = vl;
    size_t n = vl < c->bufsize ? vl : c->bufsize;
    if (n) memcpy(c->buf, v, n);
    return 0;
}

int nvh_kv_get_copy(nvh_kv *kv, const void *key, size_t klen, void *buf, size_t bufsize,
                    size_t *vlen)
{
    static const char fn[] = "nvh_kv_get_copy";
    KV_CHECK_HANDLE(kv, fn);
    int rc = nvh_kv_check_key_(kv, fn, key, klen);
    if (rc != NVH_OK) return rc;
    if (!buf && bufsize) return nvh_fail(NVH_E_INVAL, "%s: store '%s': NULL buffer of %zu "
                                         "bytes", fn, kv->name, bufsize);
    kv_copy_ctx c = {buf, bufsize, 0};
    rc = kv_engine_get(kv, key, klen, kv_copy_fn, &c);
    if (rc == NVH_E_NOTFOUND) return kv_notfound(kv, fn);
    if (rc != NVH_OK) return nvh_fail_context(rc, "%s: store '%s'", fn, kv->name);
    kv_tally(kv, KV_CTR_GETS);
    if (vlen) *vlen = c.vlen;
    if (c.vlen > bufsize)
        return nvh_fail(NVH_E_SIZE, "%s: store '%s': value of %zu bytes does not fit a buffer "
                        "of %zu", fn, kv->name, c.vlen, bufsize);
    return NVH_OK;
}

typedef struct kv_value_ctx {
    nvh_kv_value_fn fn;
    void *arg;
} kv_value_ctx;

static int kv_value_fn(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    (void)k, (void)kl;
    kv_value_ctx *c = arg;
    return c->fn(v, vl, c->arg);
}

int nvh_kv_get(nvh_kv *kv, const void *key, size_t klen, nvh_kv_value_fn fn, void *arg)
{
    static const char name[] = "nvh_kv_get";
    KV_CHECK_HANDLE(kv, name);
    int rc = nvh_kv_check_key_(kv, name, key, klen);
    if (rc != NVH_OK) return rc;
    if (!fn) return nvh_fail(NVH_E_INVAL, "%s: store '%s': NULL function", name, kv->name);
    /* fn's own NVH_E_NOTFOUND would read as "absent": that is its choice */
    kv_value_ctx c = {fn, arg};
    rc = kv_engine_get(kv, key, klen, kv_value_fn, &c);
    if (rc == NVH_E_NOTFOUND) return kv_notfound(kv, name);
    if (rc == NVH_E_CORRUPT) return nvh_fail_context(rc, "%s: store '%s'", name, kv->name);
    kv_tally(kv, KV_CTR_GETS);
    return rc;
}

static int kv_exists_fn(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    (void)k, (void)kl, (void)v, (void)vl, (void)arg;
    return 1;
}

int nvh_kv_exists(nvh_kv *kv, const void *key, size_t klen)
{
    static const char fn[] = "nvh_kv_exists";
    KV_CHECK_HANDLE(kv, fn);
    int rc = nvh_kv_check_key_(kv, fn, key, klen);
    if (rc != NVH_OK) return rc;
    rc = kv_engine_get(kv, key, klen, kv_exists_fn, NULL);
    if (rc == NVH_E_NOTFOUND) return 0;
    if (rc < 0) return nvh_fail_context(rc, "%s: store '%s'", fn, kv->name);
    kv_tally(kv, KV_CTR_GETS);
    return 1;
}

/* ==========================================================================
 * Counts and scans
 * ========================================================================== */
static int kv_ordered_only(const nvh_kv *kv, const char *fn)
{
    return nvh_fail(NVH_E_NOTSUP, "%s: store '%s' uses the hash engine, which has no key "
                    "order (use the sorted engine)", fn, kv->name);
}

static int kv_count(nvh_kv *kv, const char *fn, const void *lo, size_t lol, const void *hi,
                    size_t hil, uint64_t *count)
{
    KV_CHECK_HANDLE(kv, fn);
    if (!count) return nvh_fail(NVH_E_INVAL, "%s: store '%s': NULL count", fn, kv->name);
    if (kv->hm) return kv_ordered_only(kv, fn);
    int rc = lo ? nvh_kv_check_key_(kv, fn, lo, lol) : NVH_OK;
    if (rc == NVH_OK && hi) rc = nvh_kv_check_key_(kv, fn, hi, hil);
    if (rc != NVH_OK) return rc;
    rc = kv_sorted_count(kv->st, lo, lol, 0, hi, hil, 0, count);
    if (rc != NVH_OK) return nvh_fail_context(rc, "%s: store '%s'", fn, kv->name);
    return NVH_OK;
}

int nvh_kv_count_all(nvh_kv *kv, uint64_t *count)
{
    static const char fn[] = "nvh_kv_count_all";
    KV_CHECK_HANDLE(kv, fn);
    if (!count) return nvh_fail(NVH_E_INVAL, "%s: store '%s': NULL count", fn, kv->name);
    if (kv->hm) {
        *count = nvh_hmap_count(kv->hm);
        return NVH_OK;
    }
    int rc = kv_sorted_count(kv->st, NULL, 0, 0, NULL, 0, 0, count);
    if (rc != NVH_OK) return nvh_fail_context(rc, "%s: store '%s'", fn, kv->name);
    return NVH_OK;
}

int nvh_kv_count_above(nvh_kv *kv, const void *k, size_t kl, uint64_t *count)
{
    if (kv && !k) return nvh_fail(NVH_E_INVAL, "nvh_kv_count_above: NULL key");
    return kv_count(kv, "nvh_kv_count_above", k, kl, NULL, 0, count);
}

int nvh_kv_count_below(nvh_kv *kv, const void *k, size_t kl, uint64_t *count)
{
    if (kv && !k) return nvh_fail(NVH_E_INVAL, "nvh_kv_count_below: NULL key");
    return kv_count(kv, "nvh_kv_count_below", NULL, 0, k, kl, count);
}

int nvh_kv_count_between(nvh_kv *kv, const void *lo, size_t lol, const void *hi, size_t hil,
                         uint64_t *count)
{
    if (kv && (!lo || !hi)) return nvh_fail(NVH_E_INVAL, "nvh_kv_count_between: NULL bound");
    return kv_count(kv, "nvh_kv_count_between", lo, lol, hi, hil, count);
}

static int kv_scan(nvh_kv *kv, const char *fn, const void *lo, size_t lol, const void *hi,
                   size_t hil, nvh_kv_entry_fn efn, void *arg)
{
    KV_CHECK_HANDLE(kv, fn);
    if (!efn) return nvh_fail(NVH_E_INVAL, "%s: store '%s': NULL function", fn, kv->name);
    if (kv->hm) return kv_ordered_only(kv, fn);
    int rc = lo ? nvh_kv_check_key_(kv, fn, lo, lol) : NVH_OK;
    if (rc == NVH_OK && hi) rc = nvh_kv_check_key_(kv, fn, hi, hil);
    if (rc != NVH_OK) return rc;
    rc = kv_sorted_scan(kv->st, lo, lol, 0, hi, hil, 0, efn, arg);
    if (rc < 0 && rc >= NVH_E_ABORTED)
        return nvh_fail_context(rc, "%s: store '%s'", fn, kv->name);
    return rc;
}

int nvh_kv_get_all(nvh_kv *kv, nvh_kv_entry_fn fn, void *arg)
{
    static const char name[] = "nvh_kv_get_all";
    KV_CHECK_HANDLE(kv, name);
    if (!fn) return nvh_fail(NVH_E_INVAL, "%s: store '%s': NULL function", name, kv->name);
    if (kv->hm) {
        int rc = nvh_hmap_foreach(kv->hm, fn, arg);
        if (rc == NVH_E_CORRUPT) return nvh_fail_context(rc, "%s: store '%s'", name, kv->name);
        return rc;
    }
    return kv_scan(kv, name, NULL, 0, NULL, 0, fn, arg);
}

int nvh_kv_get_above(nvh_kv *kv, const void *k, size_t kl, nvh_kv_entry_fn fn, void *arg)
{
    if (kv && !k) return nvh_fail(NVH_E_INVAL, "nvh_kv_get_above: NULL key");
    return kv_scan(kv, "nvh_kv_get_above", k, kl, NULL, 0, fn, arg);
}

int nvh_kv_get_below(nvh_kv *kv, const void *k, size_t kl, nvh_kv_entry_fn fn, void *arg)
{
    if (kv && !k) return nvh_fail(NVH_E_INVAL, "nvh_kv_get_below: NULL key");
    return kv_scan(kv, "nvh_kv_get_below", NULL, 0, k, kl, fn, arg);
}

int nvh_kv_get_between(nvh_kv *kv, const void *lo, size_t lol, const void *hi, size_t hil,
                       nvh_kv_entry_fn fn, void *arg)
{
    if (kv && (!lo || !hi)) return nvh_fail(NVH_E_INVAL, "nvh_kv_get_between: NULL bound");
    return kv_scan(kv, "nvh_kv_get_between", lo, lol, hi, hil, fn, arg);
}
