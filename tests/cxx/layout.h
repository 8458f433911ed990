/* layout.h — the sizes and offsets of nvheap.h's types that C and C++ must
 * agree on (the inline fast paths read and write nvh_persist_ctx_ from
 * both). layout_c.c evaluates the list as C11, test_cxx.cpp as C++. */
#ifndef NVH_TEST_CXX_LAYOUT_H
#define NVH_TEST_CXX_LAYOUT_H

#include <nvheap.h>
#include <stddef.h>

#ifdef __cplusplus
#define NVH_TEST_ALIGNOF(t) alignof(t)
#else
#define NVH_TEST_ALIGNOF(t) _Alignof(t)
#endif

typedef NVH_RELPTR(int) nvh_test_int_ref;

#define NVH_TEST_LAYOUT(X)                            \
    X(sizeof(nvh_persist_ctx_))                       \
    X(NVH_TEST_ALIGNOF(nvh_persist_ctx_))             \
    X(offsetof(nvh_persist_ctx_, size))               \
    X(offsetof(nvh_persist_ctx_, domain))             \
    X(offsetof(nvh_persist_ctx_, flush_kind))         \
    X(offsetof(nvh_persist_ctx_, nt_threshold))       \
    X(offsetof(nvh_persist_ctx_, stats))              \
    X(sizeof(nvh_stat_stripe_))                       \
    X(NVH_TEST_ALIGNOF(nvh_stat_stripe_))             \
    X(sizeof(nvh_plock))                              \
    X(NVH_TEST_ALIGNOF(nvh_plock))                    \
    X(sizeof(nvh_test_int_ref))                       \
    X(NVH_TEST_ALIGNOF(nvh_test_int_ref))             \
    X(sizeof(nvh_pool_info))                          \
    X(sizeof(nvh_stats))                              \
    X(sizeof(nvh_domain))

#ifdef __cplusplus
extern "C" {
#endif
extern const size_t nvh_test_c_layout[];
extern const unsigned nvh_test_c_layout_count;
#ifdef __cplusplus
}
#endif

#endif
