/* tx_transfer.c — a durable transaction: move money between two accounts.
 *
 *   tx_transfer [PATH]
 *
 * The two balances change together or not at all, on return and on a crash:
 * nvh_tx_add_range snapshots the accounts before they are stored to, and the
 * commit makes the new values durable before nvh_tx_run returns (2 fences in
 * the pmem domain). A transfer that returns an error is rolled back, so the
 * balances are exactly as before it. */
#include "example.h"

#include <stdint.h>

struct accounts {
    int64_t balance[2];
};
struct transfer {
    struct accounts *acct;
    int from, to;
    int64_t amount;
};

static int transfer_fn(nvh_pool *pool, void *arg)     /* runs inside the transaction */
{
    struct transfer *t = arg;
    int rc = nvh_tx_add_range(pool, t->acct, sizeof *t->acct);    /* snapshot, THEN store */
    if (rc != NVH_OK) return rc;
    t->acct->balance[t->from] -= t->amount;
    t->acct->balance[t->to] += t->amount;
    if (t->acct->balance[t->from] < 0) return NVH_E_INVAL;        /* abort: rolled back */
    return NVH_OK;                                                /* commit: durable */
}

int main(int argc, char **argv)
{
    char buf[4096];
    const char *path = example_path(argc, argv, "tx_transfer", buf, sizeof buf);
    nvh_pool *pool = example_create(path, "tx_transfer");
    if (!pool) return example_fail("create");

    struct accounts *acct = nvh_root(pool, NULL);
    acct->balance[0] = 100;                            /* the opening balance, */
    nvh_persist(pool, acct, sizeof *acct);             /* before any transaction */

    struct transfer ok = {acct, 0, 1, 30};
    if (nvh_tx_run(pool, transfer_fn, &ok) != NVH_OK) return example_fail("transfer 30");
    struct transfer too_much = {acct, 0, 1, 500};
    int rc = nvh_tx_run(pool, transfer_fn, &too_much); /* overdraws: aborted */
    printf("tx_transfer: transfer of 500 returned %d, balances %lld / %lld\n", rc,
           (long long)acct->balance[0], (long long)acct->balance[1]);
    if (rc == NVH_OK || acct->balance[0] != 70 || acct->balance[1] != 30) return 1;
    if (nvh_pool_close(pool) != NVH_OK) return example_fail("close");

    pool = nvh_pool_open(path, "tx_transfer", NVH_DOMAIN_AUTO);
    if (!pool) return example_fail("reopen");
    acct = nvh_root(pool, NULL);
    int good = acct->balance[0] == 70 && acct->balance[1] == 30;
    printf("tx_transfer: after reopen %lld / %lld: %s\n", (long long)acct->balance[0],
           (long long)acct->balance[1], good ? "verified" : "MISMATCH");
    if (nvh_pool_close(pool) != NVH_OK) return example_fail("close");
    if (argc < 2) unlink(path);
    return good ? 0 : 1;
}
