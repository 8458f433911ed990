/* kv_iter.c — iterators of the key-value store (sorted engine). */
#include "kv.h"

nvh_kv_iter *nvh_kv_iter_new(nvh_kv *kv)
{
    (void)kv;
    nvh_fail(NVH_E_NOTSUP, "nvh_kv_iter_new: not implemented yet");
    return NULL;
}
void nvh_kv_iter_free(nvh_kv_iter *it) { (void)it; }
#define KV_ITER_STUB(name, ...)                                                  \
    int name(nvh_kv_iter *it, ##__VA_ARGS__)                                     \
    {                                                                            \
        (void)it;                                                                \
        return nvh_fail(NVH_E_NOTSUP, #name ": not implemented yet");            \
    }
int nvh_kv_iter_seek(nvh_kv_iter *it, const void *k, size_t kl)
{ (void)it, (void)k, (void)kl; return NVH_E_NOTSUP; }
int nvh_kv_iter_seek_lower(nvh_kv_iter *it, const void *k, size_t kl)
{ (void)it, (void)k, (void)kl; return NVH_E_NOTSUP; }
int nvh_kv_iter_seek_lower_eq(nvh_kv_iter *it, const void *k, size_t kl)
{ (void)it, (void)k, (void)kl; return NVH_E_NOTSUP; }
int nvh_kv_iter_seek_higher(nvh_kv_iter *it, const void *k, size_t kl)
{ (void)it, (void)k, (void)kl; return NVH_E_NOTSUP; }
int nvh_kv_iter_seek_higher_eq(nvh_kv_iter *it, const void *k, size_t kl)
{ (void)it, (void)k, (void)kl; return NVH_E_NOTSUP; }
KV_ITER_STUB(nvh_kv_iter_first)
KV_ITER_STUB(nvh_kv_iter_last)
KV_ITER_STUB(nvh_kv_iter_next)
KV_ITER_STUB(nvh_kv_iter_prev)
int nvh_kv_iter_key(nvh_kv_iter *it, const void **key, size_t *klen)
{ (void)it, (void)key, (void)klen; return NVH_E_NOTSUP; }
int nvh_kv_iter_value(nvh_kv_iter *it, const void **value, size_t *vlen)
{ (void)it, (void)value, (void)vlen; return NVH_E_NOTSUP; }
