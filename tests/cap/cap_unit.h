/* cap_unit.h — the fixture the capacity allocator's unit tests share: one
 * file instance in /dev/shm per test (an 8 GiB reserved range), made by
 * setup and destroyed by teardown, and the calling thread's heap of it. */
#ifndef NVH_TESTS_CAP_UNIT_H
#define NVH_TESTS_CAP_UNIT_H

#include "test_util.h"

#include "cap/cap.h"

static struct cap_inst cap;

static int setup(void **state)
{
    (void)state;
    return nvh_cap_init_file_(&cap, "/dev/shm", (size_t)8 << 30);
}

static int teardown(void **state)
{
    (void)state;
    nvh_cap_destroy_(&cap);
    return 0;
}

static struct cap_heap *heap(void)
{
    struct cap_heap *h = nvh_cap_heap_(&cap);
    assert_non_null(h);
    return h;
}

#endif
