/* alloc_list.c — the allocator with link pointers: a persistent stack.
 *
 *   alloc_list [PATH]
 *
 * push reserves a node (DRAM only), fills and persists it, then activates it:
 * ONE failure-atomic step that makes the allocation durable and stores its
 * offset into the link (the root's head). pop frees the head node and sets
 * the head to the next node in one failure-atomic step. After a crash the
 * stack is either before or after each push or pop, never in between: no
 * leaked node, no head pointing at freed memory. No transaction is needed.
 *
 * The program pushes 1..100, pops 10, closes and reopens the pool, and checks
 * that 90..1 are on the stack. */
#include "example.h"

#include <stdint.h>

struct node {
    nvh_off_t next;         /* relative pointer: offset from the pool base, 0 = NULL */
    uint64_t value;
};
struct root {
    nvh_off_t head;         /* in the root area, zeroed when the pool is created */
};

static int push(nvh_pool *pool, struct root *root, uint64_t value)
{
    struct node *n = nvh_reserve(pool, sizeof *n);    /* DRAM only: a crash frees it */
    if (!n) return nvh_errcode();
    n->next = root->head;
    n->value = value;
    nvh_persist(pool, n, sizeof *n);                  /* content durable first */
    nvh_off_t *links[] = {&root->head};
    return nvh_activate(pool, n, links, 1);           /* allocated and linked, atomically */
}

static int pop(nvh_pool *pool, struct root *root, uint64_t *value)
{
    struct node *n = nvh_ptr(pool, root->head);
    if (!n) return NVH_E_NOTFOUND;
    *value = n->value;
    nvh_link unlink_head = {&root->head, n->next};    /* head = n->next ... */
    return nvh_free(pool, n, &unlink_head, 1);        /* ... and n freed, atomically */
}

int main(int argc, char **argv)
{
    char buf[4096];
    const char *path = example_path(argc, argv, "alloc_list", buf, sizeof buf);
    nvh_pool *pool = example_create(path, "alloc_list");
    if (!pool) return example_fail("create");

    struct root *root = nvh_root(pool, NULL);
    for (uint64_t v = 1; v <= 100; v++)
        if (push(pool, root, v) != NVH_OK) return example_fail("push");
    for (int i = 0; i < 10; i++) {
        uint64_t v;
        if (pop(pool, root, &v) != NVH_OK) return example_fail("pop");
        if (v != 100 - (uint64_t)i) { fprintf(stderr, "popped %llu\n", (unsigned long long)v); return 1; }
    }
    if (nvh_pool_close(pool) != NVH_OK) return example_fail("close");

    /* Reopen (recovery would run here after a crash) and walk the stack. */
    pool = nvh_pool_open(path, "alloc_list", NVH_DOMAIN_AUTO);
    if (!pool) return example_fail("reopen");
    root = nvh_root(pool, NULL);
    uint64_t expect = 90, count = 0;
    for (struct node *n = nvh_ptr(pool, root->head); n; n = nvh_ptr(pool, n->next), expect--) {
        if (n->value != expect) { fprintf(stderr, "found %llu, expected %llu\n",
                                          (unsigned long long)n->value, (unsigned long long)expect);
                                  return 1; }
        count++;
    }
    printf("alloc_list: %llu nodes after reopen: %s\n", (unsigned long long)count,
           count == 90 ? "verified" : "MISMATCH");
    if (nvh_pool_close(pool) != NVH_OK) return example_fail("close");
    if (argc < 2) unlink(path);
    return count == 90 ? 0 : 1;
}
