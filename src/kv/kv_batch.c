/* kv_batch.c — atomic batches of the key-value store, for either engine: a
 * logical redo log. The batch's puts and removes are buffered in DRAM; at
 * commit they are written as ONE allocated object (kv.h, struct
 * kv_log_head), made durable, and linked from the store descriptor by one
 * allocator activation: that is the commit point. The operations are then
 * applied with the engine's own failure-atomic, idempotent put and remove,
 * and the log is freed with the same link cleared. A crash after the
 * commit point leaves the log linked: open applies it again from the start
 * (every operation is idempotent and they run in order, so the store ends
 * as if the batch had run once) before anything else. A crash before it
 * leaves nothing (the reservation lived in DRAM only). Format:
 * docs/FORMAT.md, "Key-value store". */
#include "kv.h"
#include "../protect/protect.h"

#include <stdlib.h>

struct nvh_kv_batch {
    nvh_kv *kv;
    uint8_t *buf;            /* the log being built, header first            */
    size_t len, cap;
    uint64_t nops;
};

#define KV_BATCH_MAX_BYTES ((uint64_t)1 << 32)   /* one log object */

nvh_kv_batch *nvh_kv_batch_new(nvh_kv *kv)
{
    if (!kv) {
        nvh_fail(NVH_E_INVAL, "nvh_kv_batch_new: NULL store");
        return NULL;
    }
    nvh_kv_batch *b = calloc(1, sizeof *b);
    if (!b) {
        nvh_fail(NVH_E_NOMEM, "nvh_kv_batch_new: out of memory");
        return NULL;
    }
    b->kv = kv;
    b->len = sizeof(struct kv_log_head);
    return b;
}

static int kv_batch_add(nvh_kv_batch *b, const char *fn, uint32_t op, const void *key,
                        size_t klen, const void *value, size_t vlen)
{
    if (!b) return nvh_fail(NVH_E_INVAL, "%s: NULL batch", fn);
    nvh_kv *kv = b->kv;
    int rc = nvh_kv_check_key_(kv, fn, key, klen);
    if (rc == NVH_OK) rc = nvh_kv_check_value_(kv, fn, value, vlen);
    if (rc != NVH_OK) return rc;
    uint64_t need = kv_log_rec_size(klen, vlen);
    if (b->len + need > KV_BATCH_MAX_BYTES)
        return nvh_fail(NVH_E_TOOLONG, "%s: store '%s': batch over %llu bytes", fn, kv->name,
                        (unsigned long long)KV_BATCH_MAX_BYTES);
    if (b->len + need > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + need) cap *= 2;
        uint8_t *nb = realloc(b->buf, cap);
        if (!nb) return nvh_fail(NVH_E_NOMEM, "%s: store '%s': out of memory", fn, kv->name);
        if (!b->buf) memset(nb, 0, sizeof(struct kv_log_head));
        b->buf = nb;
        b->cap = cap;
    }
    uint8_t *p = b->buf + b->len;
    struct kv_log_rec r = {op, (uint32_t)klen, vlen};
    memcpy(p, &r, sizeof r);
    memcpy(p + sizeof r, key, klen);
    if (vlen) memcpy(p + sizeof r + klen, value, vlen);
    memset(p + sizeof r + klen + vlen, 0, need - sizeof r - klen - vlen);
    b->len += need;
    b->nops++;
    return NVH_OK;
}

int nvh_kv_batch_put(nvh_kv_batch *b, const void *key, size_t klen, const void *value,
                     size_t vlen)
{
    return kv_batch_add(b, "nvh_kv_batch_put", KV_LOG_PUT, key, klen, value, vlen);
}

int nvh_kv_batch_remove(nvh_kv_batch *b, const void *key, size_t klen)
{
    return kv_batch_add(b, "nvh_kv_batch_remove", KV_LOG_REMOVE, key, klen, NULL, 0);
}

void nvh_kv_batch_abort(nvh_kv_batch *b)
{
    if (!b) return;
    free(b->buf);
    free(b);
}

/* ==========================================================================
 * The log: validation and application
 * ========================================================================== */
int nvh_kv_log_validate_(nvh_kv *kv, const struct kv_log_head *h, size_t usable)
{
    nvh_off_t off = nvh_off(kv->pool, h);
    const char *why = NULL;
    if (usable < sizeof *h) why = "is too small";
    else if (h->magic != NVH_KV_LOG_MAGIC) why = "fails its magic";
    else if (h->version != NVH_KV_LOG_VERSION) why = "has an unknown version";
    else if (h->bytes < sizeof *h || h->bytes > usable) why = "has a size beyond its object";
    else if (h->check != nvh_crc32c(0, (const uint8_t *)h + sizeof *h, h->bytes - sizeof *h))
        why = "fails its checksum";
    if (!why) {
        const uint8_t *p = (const uint8_t *)h + sizeof *h, *end = (const uint8_t *)h + h->bytes;
        for (uint64_t i = 0; i < h->nops && !why; i++) {
            struct kv_log_rec r;
            if ((size_t)(end - p) < sizeof r) { why = "has a record beyond its end"; break; }
            memcpy(&r, p, sizeof r);
            if ((r.op != KV_LOG_PUT && r.op != KV_LOG_REMOVE) || r.klen == 0 ||
                r.klen > NVH_KV_KEY_MAX || r.vlen > NVH_KV_VALUE_MAX ||
                (r.op == KV_LOG_REMOVE && r.vlen) ||
                kv_log_rec_size(r.klen, r.vlen) > (uint64_t)(end - p))
                why = "has a bad record";
            else p += kv_log_rec_size(r.klen, r.vlen);
        }
        if (!why && p != end) why = "has bytes after its last record";
    }
    if (why) return nvh_fail(NVH_E_CORRUPT, "store '%s': batch log at offset %llu %s", kv->name,
                             (unsigned long long)off, why);
    return NVH_OK;
}

/* Apply every record in order, then free the log and clear desc.batch in
 * one failure-atomic step. Idempotent: a crash anywhere repeats it. */
static int kv_log_apply(nvh_kv *kv, struct kv_log_head *h)
{
    const uint8_t *p = (const uint8_t *)h + sizeof *h;
    for (uint64_t i = 0; i < h->nops; i++) {
        struct kv_log_rec r;
        memcpy(&r, p, sizeof r);
        const uint8_t *key = p + sizeof r;
        int rc = r.op == KV_LOG_PUT ? nvh_kv_engine_put_(kv, key, r.klen, key + r.klen, r.vlen)
                                    : nvh_kv_engine_remove_(kv, key, r.klen);
        if (rc != NVH_OK && !(r.op == KV_LOG_REMOVE && rc == NVH_E_NOTFOUND))
            return nvh_fail_context(rc, "store '%s': applying operation %llu of %llu of a "
                                    "committed batch (the next open retries it)", kv->name,
                                    (unsigned long long)i + 1, (unsigned long long)h->nops);
        p += kv_log_rec_size(r.klen, r.vlen);
    }
    nvh_link l = {&kv->desc->batch, 0};
    nvh_protect_internal_begin(kv->pool);
    int rc = nvh_free(kv->pool, h, &l, 1);
    nvh_protect_internal_end(kv->pool);
    return rc;
}

int nvh_kv_batch_replay_(nvh_kv *kv)
{
    nvh_off_t off = kv->desc->batch;
    struct kv_log_head *h = nvh_ptr(kv->pool, off);
    if (!h || !nvh_contains(kv->pool, h, sizeof *h))
        return nvh_fail(NVH_E_CORRUPT, "store '%s': batch log offset %llu outside the pool",
                        kv->name, (unsigned long long)off);
    size_t usable = nvh_usable_size(kv->pool, h);
    if (usable == 0)
        return nvh_fail(NVH_E_CORRUPT, "store '%s': batch log at offset %llu is not an "
                        "allocated object", kv->name, (unsigned long long)off);
    int rc = nvh_kv_log_validate_(kv, h, usable);
    if (rc != NVH_OK) return rc;
    return kv_log_apply(kv, h);
}

/* ==========================================================================
 * Commit
 * ========================================================================== */
int nvh_kv_batch_commit(nvh_kv_batch *b)
{
    static const char fn[] = "nvh_kv_batch_commit";
    if (!b) return nvh_fail(NVH_E_INVAL, "%s: NULL batch", fn);
    nvh_kv *kv = b->kv;
    int rc = nvh_kv_check_write_(kv, fn);
    if (rc != NVH_OK || b->nops == 0) {
        nvh_kv_batch_abort(b);
        if (rc == NVH_OK) kv_tally(kv, KV_CTR_BATCHES);
        return rc;
    }
    nvh_pool *pool = kv->pool;
    struct kv_log_head *hb = (struct kv_log_head *)(void *)b->buf;
    hb->magic = NVH_KV_LOG_MAGIC;
    hb->version = NVH_KV_LOG_VERSION;
    hb->bytes = b->len;
    hb->nops = b->nops;
    hb->check = nvh_crc32c(0, b->buf + sizeof *hb, b->len - sizeof *hb);

    nvh_protect_internal_begin(pool);
    struct kv_log_head *h = nvh_reserve(pool, b->len);
    if (!h) {
        rc = nvh_fail_context(nvh_errcode(), "%s: store '%s': a log of %zu bytes", fn, kv->name,
                              b->len);
        goto out;
    }
    nvh_memcpy_nodrain(pool, h, b->buf, b->len);
    nvh_drain(pool);                          /* the log is durable ... */
    pthread_rwlock_wrlock(&kv->wlock);
    nvh_off_t *links[1] = {&kv->desc->batch};
    rc = nvh_activate(pool, h, links, 1);     /* ... before it is linked: committed */
    if (rc != NVH_OK) {
        pthread_rwlock_unlock(&kv->wlock);
        nvh_cancel(pool, h);
        rc = nvh_fail_context(rc, "%s: store '%s'", fn, kv->name);
        goto out;
    }
    rc = kv_log_apply(kv, h);
    pthread_rwlock_unlock(&kv->wlock);
    if (rc != NVH_OK) rc = nvh_fail_context(rc, "%s", fn);
    else kv_tally(kv, KV_CTR_BATCHES);
out:
    nvh_protect_internal_end(pool);
    nvh_kv_batch_abort(b);
    return rc;
}
