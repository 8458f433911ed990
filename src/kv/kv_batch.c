/* kv_batch.c — atomic batches of the key-value store. */
#include "kv.h"

nvh_kv_batch *nvh_kv_batch_new(nvh_kv *kv)
{
    (void)kv;
    nvh_fail(NVH_E_NOTSUP, "nvh_kv_batch_new: not implemented yet");
    return NULL;
}
int nvh_kv_batch_put(nvh_kv_batch *b, const void *key, size_t klen, const void *value,
                     size_t vlen)
{ (void)b, (void)key, (void)klen, (void)value, (void)vlen; return NVH_E_NOTSUP; }
int nvh_kv_batch_remove(nvh_kv_batch *b, const void *key, size_t klen)
{ (void)b, (void)key, (void)klen; return NVH_E_NOTSUP; }
int nvh_kv_batch_commit(nvh_kv_batch *b) { (void)b; return NVH_E_NOTSUP; }
void nvh_kv_batch_abort(nvh_kv_batch *b) { (void)b; }
int nvh_kv_batch_replay_(nvh_kv *kv)
{
    (void)kv;
    return nvh_fail(NVH_E_NOTSUP, "batch replay not implemented yet");
}
int nvh_kv_log_validate_(nvh_kv *kv, const struct kv_log_head *h, size_t usable)
{ (void)kv, (void)h, (void)usable; return NVH_E_NOTSUP; }
