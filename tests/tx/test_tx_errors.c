/* test_tx_errors.c — include/nvheap.h: "after a failed call inside a
 * transaction the transaction is aborted (rolled back) except for NVH_E_INVAL
 * on a bad argument, which leaves it untouched". One test per error code of
 * the calls that add to a transaction: the failed call's code, the stage
 * afterwards, the data (rolled back or not) and what the commit returns. */
#include "test_util.h"

#define LAYOUT "txerrors"
#define MIB ((uint64_t)1 << 20)

static nvh_pool *pool;
static const char *path;
static uint64_t *obj;                 /* a 4 KiB object, all words 7 */

static int setup(void **state)
{
    (void)state;
    path = test_path("txerrors");
    pool = nvh_pool_create(path, LAYOUT, 8 * MIB, NVH_DOMAIN_PROCESS);
    if (!pool) return -1;
    obj = nvh_alloc(pool, 4096, NULL, NULL, NULL);
    if (!obj) return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    nvh_pool_close(pool);
    unlink(path);
    return 0;
}

/* begin; snapshot obj[0] and store 99 into it (so a rollback shows) */
static void begin_with_store(void)
{
    obj[0] = 7;
    nvh_persist(pool, obj, 8);
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_add_range(pool, &obj[0], 8), NVH_OK);
    obj[0] = 99;
}

/* the failed call aborted: rolled back, the commit says so, then no tx */
static void expect_aborted(int rc, int code)
{
    assert_int_equal(rc, code);
    assert_int_equal(nvh_tx_stage_get(pool), NVH_TX_ABORTED);
    assert_int_equal(obj[0], 7);
    assert_int_equal(nvh_tx_add_range(pool, &obj[1], 8), NVH_E_ABORTED);
    assert_int_equal(nvh_tx_commit(pool), NVH_E_ABORTED);
    assert_int_equal(nvh_tx_stage_get(pool), NVH_TX_NONE);
    assert_int_equal(obj[0], 7);
}

static void inval_leaves_tx_usable(void **state)
{
    (void)state;
    begin_with_store();
    assert_int_equal(nvh_tx_add_range(pool, NULL, 8), NVH_E_INVAL);
    assert_int_equal(nvh_tx_add_word(pool, (char *)obj + 4), NVH_E_INVAL);
    assert_int_equal(nvh_tx_add_range_hint(pool, obj, 8, (nvh_tx_hint)9), NVH_E_INVAL);
    assert_int_equal(nvh_tx_write_word(pool, (char *)obj + 4, 1), NVH_E_INVAL);
    assert_int_equal(nvh_tx_stage_get(pool), NVH_TX_WORK);
    assert_int_equal(obj[0], 99);
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    assert_int_equal(obj[0], 99);
}

static void badptr_add_range_aborts(void **state)
{
    (void)state;
    uint64_t local = 0;
    begin_with_store();
    expect_aborted(nvh_tx_add_range(pool, &local, 8), NVH_E_BADPTR);
}

static void badptr_add_ranges_aborts(void **state)
{
    (void)state;
    uint64_t local = 0;
    begin_with_store();
    nvh_tx_range r[2] = {{&obj[2], 8, NVH_TX_HINT_AUTO}, {&local, 8, NVH_TX_HINT_AUTO}};
    expect_aborted(nvh_tx_add_ranges(pool, r, 2), NVH_E_BADPTR);
}

static void badptr_write_word_aborts(void **state)
{
    (void)state;
    uint64_t local = 0;
    begin_with_store();
    expect_aborted(nvh_tx_write_word(pool, &local, 1), NVH_E_BADPTR);
}

static void badptr_free_aborts(void **state)
{
    (void)state;
    begin_with_store();
    expect_aborted(nvh_tx_free(pool, &obj[1]), NVH_E_BADPTR);     /* interior pointer */
}

static void badptr_open_write_aborts(void **state)
{
    (void)state;
    uint64_t local = 0;
    begin_with_store();
    expect_aborted(nvh_tx_open_write(pool, &local, 8) ? NVH_OK : nvh_errcode(), NVH_E_BADPTR);
}

static void doublefree_aborts(void **state)
{
    (void)state;
    void *o = nvh_alloc(pool, 64, NULL, NULL, NULL);
    assert_non_null(o);
    begin_with_store();
    assert_int_equal(nvh_tx_free(pool, o), NVH_OK);
    expect_aborted(nvh_tx_free(pool, o), NVH_E_DOUBLEFREE);
    assert_true(nvh_usable_size(pool, o) >= 64);                 /* the free was dropped */
}

static void nospace_aborts(void **state)
{
    (void)state;
    nvh_tx_config c, small;
    assert_int_equal(nvh_tx_config_get(pool, &c), NVH_OK);
    small = c;
    small.log_limit = 2 * 4096;
    assert_int_equal(nvh_tx_config_set(pool, &small), NVH_OK);
    void *big = nvh_alloc(pool, 64 * 1024, NULL, NULL, NULL);
    assert_non_null(big);
    begin_with_store();
    int rc = nvh_tx_add_range(pool, big, 64 * 1024);
    /* the cause survives the rollback, with the abort as its context */
    assert_int_equal(nvh_errcode(), NVH_E_NOSPACE);
    assert_ptr_equal(strstr(nvh_errormsg(), "transaction aborted: "), nvh_errormsg());
    assert_true(strlen(nvh_errormsg()) > strlen("transaction aborted: "));
    expect_aborted(rc, NVH_E_NOSPACE);
    assert_int_equal(nvh_tx_config_set(pool, &c), NVH_OK);
}

static void aborted_stays_aborted(void **state)
{
    (void)state;
    begin_with_store();
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);                  /* nested */
    assert_int_equal(nvh_tx_abort(pool), NVH_OK);                  /* inner abort */
    assert_int_equal(nvh_tx_stage_get(pool), NVH_TX_ABORTED);
    assert_int_equal(obj[0], 7);
    assert_int_equal(nvh_tx_add_range(pool, &obj[1], 8), NVH_E_ABORTED);
    assert_int_equal(nvh_tx_write_word(pool, &obj[1], 1), NVH_E_ABORTED);
    assert_int_equal(nvh_tx_commit(pool), NVH_E_ABORTED);
    assert_int_equal(nvh_tx_stage_get(pool), NVH_TX_NONE);
}

/* A named object is freed through its name, never by nvh_tx_free (the name
 * would then lead to memory handed to another object): NVH_E_INVAL, so the
 * transaction goes on. */
static void free_of_named_is_inval(void **state)
{
    (void)state;
    void *n = nvh_reserve_named(pool, "txnamed", 64);
    assert_non_null(n);
    assert_int_equal(nvh_activate_named(pool, "txnamed"), NVH_OK);
    begin_with_store();
    assert_int_equal(nvh_tx_free(pool, n), NVH_E_INVAL);
    assert_int_equal(nvh_tx_stage_get(pool), NVH_TX_WORK);
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    assert_int_equal(obj[0], 99);
    assert_ptr_equal(nvh_get_named(pool, "txnamed", NULL), n);
    assert_int_equal(nvh_free_named(pool, "txnamed"), NVH_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(inval_leaves_tx_usable),
        cmocka_unit_test(badptr_add_range_aborts),
        cmocka_unit_test(badptr_add_ranges_aborts),
        cmocka_unit_test(badptr_write_word_aborts),
        cmocka_unit_test(badptr_free_aborts),
        cmocka_unit_test(badptr_open_write_aborts),
        cmocka_unit_test(doublefree_aborts),
        cmocka_unit_test(nospace_aborts),
        cmocka_unit_test(aborted_stays_aborted),
        cmocka_unit_test(free_of_named_is_inval),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
