/* plock.c — epoch-based persistent locks ([Coburn09] §4.2).
 *
 * A lock is one 8-byte word in the pool. It is held when it equals the
 * pool's current epoch, which nvh_pool_open increments: after a crash or a
 * restart every lock is free at once, without scanning the pool. The word
 * needs no flushing — its durable value never matters. */
#include "tx.h"

#include <sched.h>

/* Lock words in a protected pool are written inside a window of their own
 * (one load and a branch when protection is off; a lock in DRAM has none). */
static inline void lock_win_open(nvh_pool *pool, nvh_plock *lock)
{
    if (nvh_txlog_protected_(pool) && nvh_contains(pool, lock, sizeof *lock))
        (void)nvh_protect_open_(pool, lock, sizeof *lock);
}
static inline void lock_win_close(nvh_pool *pool, nvh_plock *lock)
{
    if (nvh_txlog_protected_(pool) && nvh_contains(pool, lock, sizeof *lock))
        (void)nvh_protect_close_(pool, lock, sizeof *lock);
}

static inline int check(nvh_pool *pool, const nvh_plock *lock, const char *what)
{
    if (!pool || !lock) return nvh_fail(NVH_E_INVAL, "%s: NULL argument", what);
    if ((uintptr_t)lock % 8) return nvh_fail(NVH_E_INVAL, "%s: lock is not 8-byte aligned", what);
    return NVH_OK;
}

int nvh_plock_try(nvh_pool *pool, nvh_plock *lock)
{
    int rc = check(pool, lock, "nvh_plock_try");
    if (rc != NVH_OK) return rc;
    uint64_t epoch = nvh_pool_epoch(pool);
    uint64_t w = atomic_load_explicit(&lock->word, memory_order_relaxed);
    if (w == epoch) return nvh_fail(NVH_E_BUSY, "lock %p is held", (void *)lock);
    /* any other value (0, or an epoch of an earlier run) means free */
    lock_win_open(pool, lock);
    bool won = atomic_compare_exchange_strong_explicit(&lock->word, &w, epoch,
                                                       memory_order_acquire, memory_order_relaxed);
    lock_win_close(pool, lock);
    if (!won) return nvh_fail(NVH_E_BUSY, "lock %p is held", (void *)lock);
    return NVH_OK;
}

int nvh_plock_acquire(nvh_pool *pool, nvh_plock *lock)
{
    int rc = check(pool, lock, "nvh_plock_acquire");
    if (rc != NVH_OK) return rc;
    uint64_t epoch = nvh_pool_epoch(pool);
    for (unsigned spins = 0;; spins++) {
        uint64_t w = atomic_load_explicit(&lock->word, memory_order_relaxed);
        if (w != epoch) {
            lock_win_open(pool, lock);
            bool won = atomic_compare_exchange_weak_explicit(&lock->word, &w, epoch,
                                                             memory_order_acquire,
                                                             memory_order_relaxed);
            lock_win_close(pool, lock);
            if (won) return NVH_OK;
        }
        if (spins > 64) sched_yield();
#if defined(__x86_64__)
        else __asm__ volatile("pause");
#endif
    }
}

int nvh_plock_release(nvh_pool *pool, nvh_plock *lock)
{
    int rc = check(pool, lock, "nvh_plock_release");
    if (rc != NVH_OK) return rc;
    if (atomic_load_explicit(&lock->word, memory_order_relaxed) != nvh_pool_epoch(pool))
        return nvh_fail(NVH_E_INVAL, "nvh_plock_release: lock %p is not held", (void *)lock);
    lock_win_open(pool, lock);
    atomic_store_explicit(&lock->word, 0, memory_order_release);
    lock_win_close(pool, lock);
    return NVH_OK;
}

int nvh_plock_held(nvh_pool *pool, const nvh_plock *lock)
{
    if (!pool || !lock) return 0;
    return atomic_load_explicit(&((nvh_plock *)lock)->word, memory_order_relaxed) ==
           nvh_pool_epoch(pool);
}
