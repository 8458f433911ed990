/* test_tx_log_damage.c — a damaged transaction log is reported, not
 * ignored. A child process dies inside a transaction (its in-place stores
 * are in the file, its undo records in its lane); the parent damages one
 * word of that lane's log (state word, retire word, segment link, segment
 * header) and checks that the open fails with NVH_E_CORRUPT naming the lane
 * and offset, instead of skipping the rollback and keeping the dead
 * transaction's writes. Undamaged, the same image opens and is rolled back. */
#include "test_util.h"

#include <sys/wait.h>

#include "log/log.h"        /* white-box: the log directory's layout */

#define LAYOUT "txlogdamage"
#define NW 16

static const char *path;
static uint64_t dir_off;           /* the directory in the file */

/* A pool whose lane holds the undo records of a transaction that died after
 * storing 0xDEAD into root[0..NW) (which held i + 1). */
static void make_inflight(void)
{
    path = test_path("txlogdamage");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 4u << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    uint64_t *root = nvh_root(pool, NULL);
    for (int i = 0; i < NW; i++) root[i] = (uint64_t)i + 1;
    nvh_persist(pool, root, NW * 8);
    /* the directory and both slots' first segments: linked (and retired by
     * the allocator) before the transaction that dies */
    for (int k = 0; k < 2; k++) {
        assert_int_equal(nvh_tx_begin(pool), NVH_OK);
        assert_int_equal(nvh_tx_add_range(pool, &root[NW], 8), NVH_OK);
        assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    }
    size_t size;
    void *d = nvh_get_named(pool, NVH_TX_DIR_NAME, &size);
    assert_non_null(d);
    dir_off = nvh_off(pool, d);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        nvh_pool *p = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
        if (!p) _exit(2);
        uint64_t *r = nvh_root(p, NULL);
        if (nvh_tx_begin(p) != NVH_OK || nvh_tx_add_range(p, r, NW * 8) != NVH_OK) _exit(3);
        for (int i = 0; i < NW; i++) r[i] = 0xDEAD;
        nvh_persist(p, r, NW * 8);
        _exit(0);                                   /* dies inside the transaction */
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* the lane whose state is ACTIVE (the dead transaction's) */
static unsigned active_lane(struct nvh_lane_hdr *hdr)
{
    for (unsigned i = 0; i < NVH_TX_LANES; i++) {
        uint64_t at = dir_off + offsetof(struct nvh_tx_dir, lane) + (uint64_t)i * 64;
        test_peek(path, (off_t)at, hdr, sizeof *hdr);
        if (NVH_LS_VALID(hdr->state) && NVH_LS_ST(hdr->state) == NVH_LS_ACTIVE) return i;
    }
    fail_msg("no ACTIVE lane");
    return 0;
}

static uint64_t lane_off(unsigned i)
{
    return dir_off + offsetof(struct nvh_tx_dir, lane) + (uint64_t)i * 64;
}

static void expect_corrupt(const char *what)
{
    test_expect_open_corrupt(path, LAYOUT, what);
}

/* put a word back and check that the open now rolls the transaction back */
static void expect_rolled_back(void)
{
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    uint64_t *root = nvh_root(pool, NULL);
    for (int i = 0; i < NW; i++) assert_int_equal(root[i], (uint64_t)i + 1);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void damage_word(uint64_t at, uint64_t value, const char *what)
{
    uint64_t old;
    test_peek(path, (off_t)at, &old, 8);
    test_poke(path, (off_t)at, &value, 8);
    expect_corrupt(what);
    test_poke(path, (off_t)at, &old, 8);
    expect_rolled_back();
}

static void undamaged_rolls_back(void **state)
{
    (void)state;
    make_inflight();
    expect_rolled_back();
}

static void state_word_zeroed(void **state)
{
    (void)state;
    make_inflight();
    struct nvh_lane_hdr h;
    unsigned i = active_lane(&h);
    damage_word(lane_off(i) + offsetof(struct nvh_lane_hdr, state), 0, "state word");
}

static void state_word_flipped(void **state)
{
    (void)state;
    make_inflight();
    struct nvh_lane_hdr h;
    unsigned i = active_lane(&h);
    damage_word(lane_off(i) + offsetof(struct nvh_lane_hdr, state), h.state ^ 1, "state word");
}

static void retire_word_zeroed(void **state)
{
    (void)state;
    make_inflight();
    struct nvh_lane_hdr h;
    unsigned i = active_lane(&h);
    uint64_t at = dir_off + offsetof(struct nvh_tx_dir, retire) + (uint64_t)i * 64;
    damage_word(at, 0, "retire word");
}

static void slot_head_zeroed(void **state)
{
    (void)state;
    make_inflight();
    struct nvh_lane_hdr h;
    unsigned i = active_lane(&h);
    unsigned slot = NVH_LS_SLOT(h.state);
    damage_word(lane_off(i) + offsetof(struct nvh_lane_hdr, slot_head) + slot * 8u, 0,
                "first segment");
}

static void segment_header_damaged(void **state)
{
    (void)state;
    make_inflight();
    struct nvh_lane_hdr h;
    (void)active_lane(&h);
    uint64_t seg = h.slot_head[NVH_LS_SLOT(h.state)];
    struct nvh_seg s;
    test_peek(path, (off_t)seg, &s, sizeof s);
    /* fewer record slots: the walk would stop early, rolling back nothing */
    uint64_t caps = (uint64_t)s.data_cap << 32 | 0;
    damage_word(seg + offsetof(struct nvh_seg, nrec_cap), caps, "first segment");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(undamaged_rolls_back),
        cmocka_unit_test(state_word_zeroed),
        cmocka_unit_test(state_word_flipped),
        cmocka_unit_test(retire_word_zeroed),
        cmocka_unit_test(slot_head_zeroed),
        cmocka_unit_test(segment_header_damaged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
