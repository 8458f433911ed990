/* sorted_stub.c — stands in for the sorted engine (src/kv/sorted*.c) in a tree
 * that does not have it yet: every call fails NVH_E_NOTSUP, so a store asked
 * for engine "sorted" is refused with a clear message. CMakeLists.txt builds
 * this file only when src/kv/sorted.c does not exist. */
#include "sorted.h"
#include "../common/internal.h"

static int kv_sorted_absent(const char *fn)
{
    return nvh_fail(NVH_E_NOTSUP, "%s: the sorted engine is not built into this library "
                    "(use engine \"hash\")", fn);
}

int kv_sorted_create(nvh_pool *pool, nvh_off_t *link)
{
    (void)pool, (void)link;
    return kv_sorted_absent("kv_sorted_create");
}

kv_sorted *kv_sorted_open(nvh_pool *pool, nvh_off_t root, kv_cmp_fn cmp, void *cmp_arg)
{
    (void)pool, (void)root, (void)cmp, (void)cmp_arg;
    kv_sorted_absent("kv_sorted_open");
    return NULL;
}

int kv_sorted_close(kv_sorted *t)
{
    (void)t;
    return NVH_OK;
}

int kv_sorted_destroy(kv_sorted *t, nvh_off_t *link)
{
    (void)t, (void)link;
    return kv_sorted_absent("kv_sorted_destroy");
}

int kv_sorted_put(kv_sorted *t, const void *k, size_t kl, const void *v, size_t vl)
{
    (void)t, (void)k, (void)kl, (void)v, (void)vl;
    return kv_sorted_absent("kv_sorted_put");
}

int kv_sorted_remove(kv_sorted *t, const void *k, size_t kl)
{
    (void)t, (void)k, (void)kl;
    return kv_sorted_absent("kv_sorted_remove");
}

int kv_sorted_get(kv_sorted *t, const void *k, size_t kl, kv_entry_fn fn, void *arg)
{
    (void)t, (void)k, (void)kl, (void)fn, (void)arg;
    return kv_sorted_absent("kv_sorted_get");
}

int kv_sorted_seek(kv_sorted *t, enum kv_seek how, const void *k, size_t kl,
                   kv_entry_fn fn, void *arg)
{
    (void)t, (void)how, (void)k, (void)kl, (void)fn, (void)arg;
    return kv_sorted_absent("kv_sorted_seek");
}

int kv_sorted_scan(kv_sorted *t, const void *lo, size_t lol, int lo_incl,
                   const void *hi, size_t hil, int hi_incl, kv_entry_fn fn, void *arg)
{
    (void)t, (void)lo, (void)lol, (void)lo_incl, (void)hi, (void)hil, (void)hi_incl;
    (void)fn, (void)arg;
    return kv_sorted_absent("kv_sorted_scan");
}

int kv_sorted_count(kv_sorted *t, const void *lo, size_t lol, int lo_incl,
                    const void *hi, size_t hil, int hi_incl, uint64_t *count)
{
    (void)t, (void)lo, (void)lol, (void)lo_incl, (void)hi, (void)hil, (void)hi_incl;
    (void)count;
    return kv_sorted_absent("kv_sorted_count");
}

int kv_sorted_check(kv_sorted *t)
{
    (void)t;
    return kv_sorted_absent("kv_sorted_check");
}
