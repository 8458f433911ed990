/* layout_c.c — nvheap.h's layout as the C compiler sees it (layout.h), for
 * test_cxx to compare with the C++ view. Compiled with -std=c11 -Wpedantic:
 * the header must also be clean in strict ISO C. */
#include "layout.h"

#define NVH_TEST_ITEM(e) (size_t)(e),
const size_t nvh_test_c_layout[] = { NVH_TEST_LAYOUT(NVH_TEST_ITEM) };
const unsigned nvh_test_c_layout_count = sizeof nvh_test_c_layout / sizeof nvh_test_c_layout[0];
