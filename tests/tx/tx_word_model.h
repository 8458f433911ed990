/* tx_word_model.h — the model of a region of NW words that the transaction
 * crash tests of word transactions (test_tx_proto.c, test_tx_redo.c) keep
 * next to their workloads: the value generator, the region (allocated once
 * and linked from root word 0), and the acknowledged state (exp_prev) with
 * the state of the transaction in flight (exp_next). A test writes its new
 * values into exp_next between model_begin() and model_ack(); its checker
 * compares the recovered region with both (tx_region_check in
 * tx_crash_test.h). The model lives in static memory so that the forked
 * crash checkers inherit it. */
#ifndef NVH_TESTS_TX_WORD_MODEL_H
#define NVH_TESTS_TX_WORD_MODEL_H

#include <stdint.h>
#include <string.h>

#include "test_util.h"

#define NW 64u                  /* region words */
#define REG (NW * 8u)

/* the model, inherited by the forked checkers */
static uint64_t exp_prev[NW], exp_next[NW];
static volatile int g_inflight;
static volatile uint64_t g_acked;

/* The region of the pool (allocated on first use); the model restarts empty. */
static uint64_t *region(nvh_pool *pool)
{
    g_acked = 0;            /* the explorer runs a workload twice */
    g_inflight = 0;
    nvh_off_t *root = nvh_root(pool, NULL);
    if (!root[0] && !nvh_alloc(pool, REG, NULL, NULL, &root[0])) return NULL;
    return nvh_ptr(pool, root[0]);
}

/* The acknowledged state is what the region holds now. */
static void model_reset(uint64_t *reg)
{
    g_acked = 0;
    g_inflight = 0;
    memcpy(exp_prev, reg, REG);
    memcpy(exp_next, reg, REG);
}
/* A transaction starts from the acknowledged state ... */
static void model_begin(void) { memcpy(exp_next, exp_prev, REG); g_inflight = 1; }
/* ... and, once committed, becomes it. */
static void model_ack(void) { memcpy(exp_prev, exp_next, REG); g_acked++; g_inflight = 0; }

#endif /* NVH_TESTS_TX_WORD_MODEL_H */
