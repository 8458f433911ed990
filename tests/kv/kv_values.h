/* kv_values.h — the values of the kv thread tests: each names its key and
 * version and is filled with one byte, so a torn or reused value is
 * recognised ("<key>|<ver>|" + fill, at most KV_VALUE_MAX bytes). */
#ifndef NVH_TEST_KV_VALUES_H
#define NVH_TEST_KV_VALUES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define KV_VALUE_MAX 224u     /* longest value make_value writes */

static inline size_t make_value(uint32_t key, uint32_t ver, char *v)
{
    size_t n = (size_t)sprintf(v, "%u|%u|", key, ver);
    size_t len = n + (key * 13 + ver * 7) % 200;
    memset(v + n, 'a' + (int)((key + ver) % 26), len - n);
    return len;
}

static inline bool value_ok(uint32_t key, const char *v, size_t vl)
{
    unsigned k, ver;
    char tmp[KV_VALUE_MAX + 1];
    if (vl > KV_VALUE_MAX) return false;
    memcpy(tmp, v, vl);
    tmp[vl] = 0;
    if (sscanf(tmp, "%u|%u|", &k, &ver) != 2 || k != key) return false;
    char want[KV_VALUE_MAX + 1];
    return make_value(key, ver, want) == vl && memcmp(want, v, vl) == 0;
}

#endif
