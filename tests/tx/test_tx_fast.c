/* test_tx_fast.c — the in-place fast path of the plain transaction calls
 * (src/tx/tx.c, add_words_fast) and the thread's cached descriptor:
 *   - the fast path's shapes next to the general path's: a word given twice
 *     in one call logs once, a word logged by the fast path is not logged
 *     again by a later general add, ranges and objects after fast words,
 *     words the fast path declines (bad pointer, unaligned, hints, more
 *     than the lazy commit holds); every case checked after commit, abort
 *     and reopen, with the fences and lines it costs;
 *   - a lane given back to make room for another pool's (lane.c, tls_fill)
 *     is not used again through the thread's cached descriptor
 *     (nvh_tx_last_): another thread that took the lane keeps it to itself.
 * Crashes at every fence of the fast path: test_tx_proto every_fence (its
 * K_INPLACE, K_IN_AT, K_NESTED and K_FREE steps take it). */
#include "tx_unit.h"

#include <pthread.h>
#include <stdbool.h>

#define LAYOUT "txfast"
#define MIB ((uint64_t)1 << 20)

static nvh_pool *mkpool(const char *name, const char **path_out)
{
    return tx_unit_pool(name, LAYOUT, 8 * MIB, NVH_DOMAIN_PROCESS, path_out);
}

static uint64_t *mkobj(nvh_pool *pool, size_t size) { return tx_unit_obj(pool, size); }

static uint64_t logged(nvh_pool *pool)
{
    nvh_tx_stats st;
    assert_int_equal(nvh_tx_stats_get(pool, &st), NVH_OK);
    return st.bytes_logged;
}

/* lines and fences of one transaction adding ranges r (then +1 to each
 * word-aligned start), committed */
static void cost_of(nvh_pool *pool, const nvh_tx_range *r, unsigned n, uint64_t *lines,
                    uint64_t *fences)
{
    nvh_stats s;
    nvh_stats_reset(pool);
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_add_ranges(pool, r, n), NVH_OK);
    for (unsigned i = 0; i < n; i++) (*(uint64_t *)r[i].ptr)++;
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    nvh_stats_get(pool, &s);
    *lines = s.lines_flushed;
    *fences = s.fences;
}

static void shapes(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = mkpool("txfast", &path);
    uint64_t *o = mkobj(pool, 4096);
    uint64_t l1, f1, l2, f2, l;
    /* warm up (directory, segments), then the costs of 1 and 2 words */
    for (int k = 0; k < 3; k++) {
        nvh_tx_range r = {&o[0], 8, NVH_TX_HINT_AUTO};
        cost_of(pool, &r, 1, &l1, &f1);
    }
    nvh_tx_range r1 = {&o[0], 8, NVH_TX_HINT_AUTO};
    cost_of(pool, &r1, 1, &l1, &f1);
    nvh_tx_range r2[2] = {{&o[0], 8, NVH_TX_HINT_AUTO}, {&o[8], 8, NVH_TX_HINT_WORD}};
    cost_of(pool, r2, 2, &l2, &f2);
    assert_int_equal(f1, 2);
    assert_int_equal(f2, 2);
    assert_int_equal(l1, 4);    /* header with the word, redo line, data, retirement */
    assert_int_equal(l2, 6);    /* + the second word's record and its data */
    print_message("fast path: 1 word %llu lines, swap %llu lines, 2 fences\n",
                  (unsigned long long)l1, (unsigned long long)l2);

    /* one word given twice in one call (a swap of an element with itself):
     * one record, the one-word cost; the value committed */
    uint64_t v0 = o[0];
    nvh_tx_range same[2] = {{&o[0], 8, NVH_TX_HINT_AUTO}, {&o[0], 8, NVH_TX_HINT_AUTO}};
    uint64_t b0 = logged(pool);
    nvh_stats s;
    nvh_stats_reset(pool);
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_add_ranges(pool, same, 2), NVH_OK);
    o[0] = 1234;
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    nvh_stats_get(pool, &s);
    assert_int_equal(s.lines_flushed, l1);
    assert_int_equal(logged(pool) - b0, 64 + 64);          /* header + one redo line */
    assert_int_equal(o[0], 1234);
    (void)v0;

    /* fast words, stores, then the same word again through the general
     * path (a 4-byte range inside it): not logged again, and an abort
     * restores the value before the transaction, not the stored one */
    o[0] = 10; o[8] = 20; o[16] = 30;
    nvh_persist(pool, o, 4096);
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_add_ranges(pool, r2, 2), NVH_OK);
    o[0] = 11; o[8] = 21;
    b0 = logged(pool);
    assert_int_equal(nvh_tx_add_range(pool, (char *)&o[0] + 4, 4), NVH_OK);
    assert_int_equal(nvh_tx_add_range(pool, &o[8], 8), NVH_OK);
    assert_int_equal(logged(pool), b0);
    /* a range and an object after fast words: the general path */
    assert_int_equal(nvh_tx_add_range(pool, &o[16], 24), NVH_OK);
    o[16] = 31; o[17] = 1; o[18] = 2;
    assert_int_equal(nvh_tx_abort(pool), NVH_OK);
    assert_int_equal(o[0], 10);
    assert_int_equal(o[8], 20);
    assert_int_equal(o[16], 30);
    assert_int_equal(o[17], 0);
    assert_int_equal(o[18], 0);

    /* fast words, then more fast words in a second call (one of them a
     * word of the first), then a range: committed, durable after reopen */
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_add_ranges(pool, r2, 2), NVH_OK);
    o[0] = 100; o[8] = 200;
    nvh_tx_range r3[2] = {{&o[8], 8, NVH_TX_HINT_AUTO}, {&o[24], 8, NVH_TX_HINT_AUTO}};
    assert_int_equal(nvh_tx_add_ranges(pool, r3, 2), NVH_OK);
    o[24] = 300;
    assert_int_equal(nvh_tx_add_range(pool, &o[32], 16), NVH_OK);
    o[32] = 400; o[33] = 401;
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);

    /* declined by the fast path, taken by the general one: an unaligned
     * word, a 4-byte word, the object hint, nine words */
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    nvh_tx_range odd[3] = {{(char *)&o[40] + 4, 8, NVH_TX_HINT_AUTO},
                           {&o[42], 4, NVH_TX_HINT_AUTO},
                           {&o[44], 8, NVH_TX_HINT_OBJECT}};
    assert_int_equal(nvh_tx_add_ranges(pool, odd, 3), NVH_OK);
    memset((char *)&o[40] + 4, 0xAB, 8);
    memset(&o[42], 0xCD, 4);
    o[44] = 444;
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    nvh_tx_range nine[9];
    for (int i = 0; i < 9; i++) nine[i] = (nvh_tx_range){&o[64 + 8 * i], 8, NVH_TX_HINT_AUTO};
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_add_ranges(pool, nine, 8), NVH_OK);
    assert_int_equal(nvh_tx_add_ranges(pool, &nine[8], 1), NVH_OK);   /* the ninth */
    for (int i = 0; i < 9; i++) o[64 + 8 * i] = 900 + (uint64_t)i;
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);

    /* a word outside the pool: the general path's error, and the abort */
    uint64_t outside = 0;
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_add_ranges(pool, r2, 2), NVH_OK);
    o[0] = 5555;
    nvh_tx_range bad = {&outside, 8, NVH_TX_HINT_AUTO};
    assert_int_equal(nvh_tx_add_ranges(pool, &bad, 1), NVH_E_BADPTR);
    assert_int_equal(o[0], 100);                           /* rolled back at once */
    assert_int_equal(nvh_tx_commit(pool), NVH_E_ABORTED);

    nvh_off_t off = nvh_off(pool, o);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    o = nvh_ptr(pool, off);
    assert_int_equal(o[0], 100);
    assert_int_equal(o[8], 200);
    assert_int_equal(o[24], 300);
    assert_int_equal(o[32], 400);
    assert_int_equal(o[33], 401);
    uint64_t w;
    memcpy(&w, (char *)&o[40] + 4, 8);
    assert_int_equal(w, 0xABABABABABABABABull);
    assert_int_equal(o[42] & 0xffffffffu, 0xCDCDCDCDu);
    assert_int_equal(o[44], 444);
    for (int i = 0; i < 9; i++) assert_int_equal(o[64 + 8 * i], 900 + (uint64_t)i);
    l = 0;
    (void)l;
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* --------------------------------------------------------------------------
 * A lane given back for another pool's is not the thread's any more
 * ------------------------------------------------------------------------ */
typedef struct holder {
    nvh_pool *pool;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int phase;              /* 1: B's transaction open; 2: A began; 3: B checked */
    int depth_seen;
} holder;

static void wait_phase(holder *h, int p)
{
    pthread_mutex_lock(&h->mu);
    while (h->phase < p) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
}

static void set_phase(holder *h, int p)
{
    pthread_mutex_lock(&h->mu);
    h->phase = p;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static void *holder_run(void *arg)
{
    holder *h = arg;
    if (nvh_tx_begin(h->pool) != NVH_OK) return NULL;
    set_phase(h, 1);
    wait_phase(h, 2);
    h->depth_seen = nvh_tx_depth(h->pool);   /* 1: A's begin did not nest into ours */
    set_phase(h, 3);
    nvh_tx_commit(h->pool);
    return NULL;
}

static void evicted_lane_not_reused(void **state)
{
    (void)state;
    enum { NP = 5 };    /* one more than a thread's cached lanes (lane.c TLS_SLOTS) */
    nvh_pool *p[NP];
    const char *paths[NP];
    char names[NP][16];
    for (int i = 0; i < NP; i++) {
        snprintf(names[i], sizeof names[i], "txfast%d", i);
        p[i] = mkpool(names[i], &paths[i]);
    }
    /* this thread's lanes in pools 0..3 (cached in that order), the last
     * transaction's descriptor (pool 3's) remembered */
    for (int i = 0; i < NP - 1; i++) {
        assert_int_equal(nvh_tx_begin(p[i]), NVH_OK);
        assert_int_equal(nvh_tx_commit(p[i]), NVH_OK);
    }
    /* pool 4's log state takes the last cache entry: pool 3's lane is given
     * back */
    nvh_tx_stats st;
    assert_int_equal(nvh_tx_stats_get(p[NP - 1], &st), NVH_OK);
    /* another thread takes that lane and keeps a transaction open */
    holder h = {.pool = p[NP - 2], .phase = 0, .depth_seen = -1};
    pthread_mutex_init(&h.mu, NULL);
    pthread_cond_init(&h.cv, NULL);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, holder_run, &h), 0);
    wait_phase(&h, 1);
    /* our begin on pool 3: a lane of our own, not the other thread's */
    assert_int_equal(nvh_tx_begin(p[NP - 2]), NVH_OK);
    assert_int_equal(nvh_tx_depth(p[NP - 2]), 1);
    set_phase(&h, 2);
    wait_phase(&h, 3);
    assert_int_equal(nvh_tx_commit(p[NP - 2]), NVH_OK);
    pthread_join(t, NULL);
    assert_int_equal(h.depth_seen, 1);
    pthread_mutex_destroy(&h.mu);
    pthread_cond_destroy(&h.cv);
    for (int i = 0; i < NP; i++) {
        assert_int_equal(nvh_pool_close(p[i]), NVH_OK);
        unlink(paths[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shapes),
        cmocka_unit_test(evicted_lane_not_reused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
