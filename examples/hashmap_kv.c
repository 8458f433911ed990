/* hashmap_kv.c — the persistent hash map: byte-string keys and values.
 *
 *   hashmap_kv [PATH]
 *
 * The map lives in the pool; its offset is kept in the root area, stored
 * there failure-atomically by nvh_hmap_create. Every put, insert, update and
 * delete is durable when it returns, and a crash leaves each one done or
 * not done. Open after a crash costs O(1). Close every map before its pool. */
#include "example.h"

#include <stdint.h>
#include <string.h>

int main(int argc, char **argv)
{
    char buf[4096];
    const char *path = example_path(argc, argv, "hashmap_kv", buf, sizeof buf);
    nvh_pool *pool = example_create(path, "hashmap_kv");
    if (!pool) return example_fail("create");

    nvh_off_t *slot = nvh_root(pool, NULL);            /* where the map's offset lives */
    if (!*slot && nvh_hmap_create(pool, slot, NULL) != NVH_OK) return example_fail("hmap create");
    nvh_hmap *map = nvh_hmap_open(pool, *slot);
    if (!map) return example_fail("hmap open");
    char key[32], value[64];
    for (int i = 0; i < 5000; i++) {                   /* grows by itself: no entry moves */
        int kl = snprintf(key, sizeof key, "user:%d", i);
        int vl = snprintf(value, sizeof value, "{\"id\": %d}", i);
        if (nvh_hmap_put(map, key, (size_t)kl, value, (size_t)vl + 1) != NVH_OK)
            return example_fail("put");
    }
    if (nvh_hmap_delete(map, "user:7", 6) != NVH_OK) return example_fail("delete");
    if (nvh_hmap_insert(map, "user:8", 6, "x", 2) != NVH_E_EXISTS) return 1;   /* no overwrite */
    if (nvh_hmap_close(map) != NVH_OK) return example_fail("hmap close");     /* map first, */
    if (nvh_pool_close(pool) != NVH_OK) return example_fail("close");         /* then pool */

    pool = nvh_pool_open(path, "hashmap_kv", NVH_DOMAIN_AUTO);
    if (!pool) return example_fail("reopen");
    map = nvh_hmap_open(pool, *(nvh_off_t *)nvh_root(pool, NULL));
    if (!map) return example_fail("hmap reopen");
    const void *v;
    size_t vlen;
    int found = nvh_hmap_get(map, "user:4242", 9, &v, &vlen) == NVH_OK &&
                strcmp(v, "{\"id\": 4242}") == 0;
    int deleted = nvh_hmap_contains(map, "user:7", 6) == 0;
    uint64_t count = nvh_hmap_count(map);
    int good = found && deleted && count == 4999;
    printf("hashmap_kv: %llu entries after reopen, user:4242 %s, user:7 %s: %s\n",
           (unsigned long long)count, found ? "found" : "missing", deleted ? "deleted" : "present",
           good ? "verified" : "MISMATCH");
    if (nvh_hmap_close(map) != NVH_OK) return example_fail("hmap close");
    if (nvh_pool_close(pool) != NVH_OK) return example_fail("close");
    if (argc < 2) unlink(path);
    return good ? 0 : 1;
}
