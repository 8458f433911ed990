/* btree_scores.c — the consistent B+ tree: 64-bit keys, values of any size.
 *
 *   btree_scores [PATH]
 *
 * Puts 1000 keys, deletes one, syncs, scans a range, closes the tree and
 * then the pool, reopens both and checks the tree. What is durable when a
 * put returns depends on the tree's mode (docs/BTREE.md, "Guarantees");
 * nvh_btree_sync makes every earlier operation durable, and nvh_btree_close
 * syncs too. Close every tree before its pool. */
#include "example.h"

#include <stdint.h>
#include <string.h>

struct score {
    char player[24];
    uint64_t points;
};

static int sum_points(uint64_t key, const void *value, size_t len, void *arg)
{
    (void)key;
    struct score s;
    memcpy(&s, value, len < sizeof s ? len : sizeof s);
    *(uint64_t *)arg += s.points;
    return 0;                                          /* 0: continue the scan */
}

int main(int argc, char **argv)
{
    char buf[4096];
    const char *path = example_path(argc, argv, "btree_scores", buf, sizeof buf);
    nvh_pool *pool = example_create(path, "btree_scores");
    if (!pool) return example_fail("create");

    nvh_btree *tree = nvh_btree_open(pool, "scores", 1, NULL);  /* 1: create if absent */
    if (!tree) return example_fail("btree open");
    for (uint64_t id = 1; id <= 1000; id++) {
        struct score s = {.points = id * 10};
        snprintf(s.player, sizeof s.player, "player-%llu", (unsigned long long)id);
        if (nvh_btree_put(tree, id, &s, sizeof s) != NVH_OK) return example_fail("put");
    }
    if (nvh_btree_delete(tree, 500) != NVH_OK) return example_fail("delete");
    if (nvh_btree_sync(tree) != NVH_OK) return example_fail("sync");   /* all durable */

    uint64_t points = 0;                               /* keys 1..10: 10 + 20 + ... + 100 */
    if (nvh_btree_scan(tree, 1, 10, sum_points, &points) != NVH_OK) return example_fail("scan");
    if (nvh_btree_close(tree) != NVH_OK) return example_fail("btree close");  /* tree first, */
    if (nvh_pool_close(pool) != NVH_OK) return example_fail("close");         /* then pool */

    pool = nvh_pool_open(path, "btree_scores", NVH_DOMAIN_AUTO);
    if (!pool) return example_fail("reopen");
    tree = nvh_btree_open(pool, "scores", 0, NULL);    /* 0: must exist */
    if (!tree) return example_fail("btree reopen");
    const void *value;
    size_t len;
    int found = nvh_btree_get(tree, 42, &value, &len) == NVH_OK &&
                strcmp(((const struct score *)value)->player, "player-42") == 0;
    int deleted = nvh_btree_get(tree, 500, NULL, NULL) == NVH_E_NOTFOUND;
    uint64_t count = nvh_btree_count(tree);
    int good = points == 550 && found && deleted && count == 999;
    printf("btree_scores: sum 1..10 = %llu, %llu keys after reopen, key 42 %s, key 500 %s: %s\n",
           (unsigned long long)points, (unsigned long long)count, found ? "found" : "missing",
           deleted ? "deleted" : "present", good ? "verified" : "MISMATCH");
    if (nvh_btree_close(tree) != NVH_OK) return example_fail("btree close");
    if (nvh_pool_close(pool) != NVH_OK) return example_fail("close");
    if (argc < 2) unlink(path);
    return good ? 0 : 1;
}
