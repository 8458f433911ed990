/* kv_iter.c — iterators of the key-value store (sorted engine). An
 * iterator keeps a copy of its current key and value and the engine's
 * record of where that entry stood (kv_sorted_pos: a leaf and the version
 * of it the entry was read at). next/prev step within that leaf's cached
 * key order when the engine finds the leaf unchanged, else they seek
 * relative to the key (next = least key > current, prev = greatest key <
 * current). The position is no reference: the iterator never pins a node
 * or an epoch between calls, writers are never held up by it, and it sees
 * each key at most once in either direction; it is not a snapshot (keys
 * put or removed meanwhile appear or not). The hash engine has no order:
 * nvh_kv_iter_new fails NVH_E_NOTSUP. */
#include "kv.h"

#include <stdlib.h>

struct nvh_kv_iter {
    nvh_kv *kv;
    bool valid;                /* positioned on an entry                      */
    uint8_t *key, *val;        /* copies of the current entry                 */
    size_t klen, vlen, kcap, vcap;
    int err;                   /* set by the copy callback (NVH_E_NOMEM)      */
    kv_sorted_pos pos;         /* where the current entry stood               */
};

nvh_kv_iter *nvh_kv_iter_new(nvh_kv *kv)
{
    if (!kv) {
        nvh_fail(NVH_E_INVAL, "nvh_kv_iter_new: NULL store");
        return NULL;
    }
    if (kv->hm) {
        nvh_fail(NVH_E_NOTSUP, "nvh_kv_iter_new: store '%s' uses the hash engine, which has "
                 "no key order (use nvh_kv_get_all, or the sorted engine)", kv->name);
        return NULL;
    }
    nvh_kv_iter *it = calloc(1, sizeof *it);
    if (!it) nvh_fail(NVH_E_NOMEM, "nvh_kv_iter_new: out of memory");
    else it->kv = kv;
    return it;
}

void nvh_kv_iter_free(nvh_kv_iter *it)
{
    if (!it) return;
    free(it->key);
    free(it->val);
    free(it);
}

static bool iter_reserve(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    uint8_t *nb = realloc(*buf, c);
    if (!nb) return false;
    *buf = nb;
    *cap = c;
    return true;
}

/* Copy the entry the engine found (it is valid during this call only). */
static int iter_copy(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    nvh_kv_iter *it = arg;
    if (!iter_reserve(&it->key, &it->kcap, kl ? kl : 1) ||
        !iter_reserve(&it->val, &it->vcap, vl ? vl : 1)) {
        it->err = NVH_E_NOMEM;
        return 0;
    }
    memcpy(it->key, k, kl);
    if (vl) memcpy(it->val, v, vl);
    it->klen = kl;
    it->vlen = vl;
    return 0;
}

/* One seek of the sorted engine (dir 0), or a step from the current entry
 * (dir +1/-1: k is the current key); the entry found is copied into the
 * iterator, which is positioned on it (or unpositioned if none). */
static int iter_move(nvh_kv_iter *it, const char *fn, enum kv_seek how, int dir, const void *k,
                     size_t kl)
{
    nvh_kv *kv = it->kv;
    /* the engine's key argument must not be the buffer its callback
     * rewrites: steps seek from a copy */
    uint8_t small[256], *cur = NULL;
    if (k && k == it->key) {
        cur = kl <= sizeof small ? small : malloc(kl);
        if (!cur) return nvh_fail(NVH_E_NOMEM, "%s: out of memory", fn);
        memcpy(cur, k, kl);
        k = cur;
    }
    it->err = NVH_OK;
    int rc = dir ? kv_sorted_step(kv->st, dir, k, kl, iter_copy, it, &it->pos)
                 : kv_sorted_seek_pos(kv->st, how, k, kl, iter_copy, it, &it->pos);
    if (cur && cur != small) free(cur);
    if (rc == NVH_OK && it->err != NVH_OK) rc = nvh_fail(it->err, "%s: store '%s': out of "
                                                          "memory for a copy", fn, kv->name);
    it->valid = rc == NVH_OK;
    if (!it->valid) it->pos.c = NULL;
    if (rc == NVH_E_NOTFOUND) return nvh_fail(rc, "%s: store '%s': no such entry", fn, kv->name);
    if (rc != NVH_OK) return nvh_fail_context(rc, "%s: store '%s'", fn, kv->name);
    return NVH_OK;
}

static int iter_seek(nvh_kv_iter *it, const char *fn, enum kv_seek how, const void *k,
                     size_t kl)
{
    if (!it) return nvh_fail(NVH_E_INVAL, "%s: NULL iterator", fn);
    if (how != KV_SEEK_FIRST && how != KV_SEEK_LAST) {
        int rc = nvh_kv_check_key_(it->kv, fn, k, kl);
        if (rc != NVH_OK) return rc;
    }
    return iter_move(it, fn, how, 0, k, kl);
}

int nvh_kv_iter_seek(nvh_kv_iter *it, const void *k, size_t kl)
{
    return iter_seek(it, "nvh_kv_iter_seek", KV_SEEK_EQ, k, kl);
}

int nvh_kv_iter_seek_lower(nvh_kv_iter *it, const void *k, size_t kl)
{
    return iter_seek(it, "nvh_kv_iter_seek_lower", KV_SEEK_LT, k, kl);
}

int nvh_kv_iter_seek_lower_eq(nvh_kv_iter *it, const void *k, size_t kl)
{
    return iter_seek(it, "nvh_kv_iter_seek_lower_eq", KV_SEEK_LE, k, kl);
}

int nvh_kv_iter_seek_higher(nvh_kv_iter *it, const void *k, size_t kl)
{
    return iter_seek(it, "nvh_kv_iter_seek_higher", KV_SEEK_GT, k, kl);
}

int nvh_kv_iter_seek_higher_eq(nvh_kv_iter *it, const void *k, size_t kl)
{
    return iter_seek(it, "nvh_kv_iter_seek_higher_eq", KV_SEEK_GE, k, kl);
}

int nvh_kv_iter_first(nvh_kv_iter *it)
{
    return iter_seek(it, "nvh_kv_iter_first", KV_SEEK_FIRST, NULL, 0);
}

int nvh_kv_iter_last(nvh_kv_iter *it)
{
    return iter_seek(it, "nvh_kv_iter_last", KV_SEEK_LAST, NULL, 0);
}

static int iter_step(nvh_kv_iter *it, const char *fn, int dir)
{
    if (!it) return nvh_fail(NVH_E_INVAL, "%s: NULL iterator", fn);
    if (!it->valid) return nvh_fail(NVH_E_NOTFOUND, "%s: store '%s': the iterator is not on "
                                    "an entry", fn, it->kv->name);
    return iter_move(it, fn, dir > 0 ? KV_SEEK_GT : KV_SEEK_LT, dir, it->key, it->klen);
}

int nvh_kv_iter_next(nvh_kv_iter *it) { return iter_step(it, "nvh_kv_iter_next", 1); }

int nvh_kv_iter_prev(nvh_kv_iter *it) { return iter_step(it, "nvh_kv_iter_prev", -1); }

int nvh_kv_iter_key(nvh_kv_iter *it, const void **key, size_t *klen)
{
    if (!it) return nvh_fail(NVH_E_INVAL, "nvh_kv_iter_key: NULL iterator");
    if (!it->valid) return nvh_fail(NVH_E_NOTFOUND, "nvh_kv_iter_key: store '%s': the "
                                    "iterator is not on an entry", it->kv->name);
    if (key) *key = it->key;
    if (klen) *klen = it->klen;
    return NVH_OK;
}

int nvh_kv_iter_value(nvh_kv_iter *it, const void **value, size_t *vlen)
{
    if (!it) return nvh_fail(NVH_E_INVAL, "nvh_kv_iter_value: NULL iterator");
    if (!it->valid) return nvh_fail(NVH_E_NOTFOUND, "nvh_kv_iter_value: store '%s': the "
                                    "iterator is not on an entry", it->kv->name);
    if (value) *value = it->val;
    if (vlen) *vlen = it->vlen;
    return NVH_OK;
}
