/* kv_store.c — the key-value store: named stores of binary keys and values.
 *
 *   kv_store [PATH]
 *
 * nvh_kv_open opens (or creates) the pool and the store in one call; every
 * put, remove and batch is durable when it returns, and a crash leaves each
 * one whole or absent. The sorted engine keeps keys in order (bytewise by
 * default), so ranges are scans; handles may be shared by threads. */
#include "example.h"

#include <stdint.h>
#include <string.h>

static int count_user(const void *key, size_t klen, const void *value, size_t vlen, void *arg)
{
    (void)key; (void)klen; (void)value; (void)vlen;
    ++*(int *)arg;
    return 0;                                          /* non-zero would stop the scan */
}

int main(int argc, char **argv)
{
    char buf[4096];
    const char *path = example_path(argc, argv, "kv_store", buf, sizeof buf);
    nvh_kv_config c = {.path = path, .name = "users", .create = NVH_KV_CREATE_NEW};
    nvh_kv *kv = nvh_kv_open(&c);                      /* pool + store "users", sorted */
    if (!kv) return example_fail("open");
    char key[32], value[64];
    for (int i = 0; i < 1000; i++) {
        int kl = snprintf(key, sizeof key, "user:%04d", i);
        int vl = snprintf(value, sizeof value, "{\"id\": %d}", i);
        if (nvh_kv_put(kv, key, (size_t)kl, value, (size_t)vl) != NVH_OK)   /* durable now */
            return example_fail("put");
    }
    nvh_kv_batch *b = nvh_kv_batch_new(kv);            /* all or nothing */
    if (!b || nvh_kv_batch_remove(b, "user:0007", 9) != NVH_OK ||
        nvh_kv_batch_put(b, "user:1000", 9, "{\"id\": 1000}", 12) != NVH_OK ||
        nvh_kv_batch_commit(b) != NVH_OK)
        return example_fail("batch");
    if (nvh_kv_close(kv) != NVH_OK) return example_fail("close");   /* closes the pool too */

    c.create = NVH_KV_OPEN_EXISTING;
    kv = nvh_kv_open(&c);
    if (!kv) return example_fail("reopen");
    size_t n = 0;
    int found = nvh_kv_get_copy(kv, "user:0042", 9, value, sizeof value, &n) == NVH_OK &&
                n == 10 && memcmp(value, "{\"id\": 42}", 10) == 0;
    int gone = nvh_kv_exists(kv, "user:0007", 9) == 0;
    int in_range = 0;                                  /* user:0100 < key < user:0200 */
    if (nvh_kv_get_between(kv, "user:0100", 9, "user:0200", 9, count_user, &in_range) != NVH_OK)
        return example_fail("scan");
    uint64_t count = 0;
    if (nvh_kv_count_all(kv, &count) != NVH_OK) return example_fail("count");
    int good = found && gone && in_range == 99 && count == 1000;
    printf("kv_store: %llu entries after reopen, user:0042 %s, user:0007 %s, %d keys between "
           "user:0100 and user:0200: %s\n", (unsigned long long)count, found ? "found" : "missing",
           gone ? "removed" : "present", in_range, good ? "verified" : "MISMATCH");
    if (nvh_kv_close(kv) != NVH_OK) return example_fail("close");
    if (argc < 2) unlink(path);
    return good ? 0 : 1;
}
