// header_only.cpp — nvheap.h compiles as C++ of every standard from C++11 on
// (built once per standard by tests/cxx/CMakeLists.txt; nothing runs).
#include <nvheap.h>

// The inline API must be usable, not just declared: instantiate each call.
void nvh_test_header_only(nvh_pool *pool, void *p, const void *src, size_t len);
void nvh_test_header_only(nvh_pool *pool, void *p, const void *src, size_t len)
{
    nvh_flush(pool, p, len);
    nvh_drain(pool);
    nvh_persist(pool, p, len);
    nvh_memset_persist(pool, p, 0, len);
    nvh_memcpy_persist(pool, p, src, len);
    nvh_memcpy_nodrain(pool, p, src, len);
    nvh_memset_nodrain(pool, p, 0, len);
    (void)nvh_contains(pool, p, len);
    (void)nvh_ptr(pool, nvh_off(pool, p));
}
