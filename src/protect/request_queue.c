/* request_queue.c — the async request queue: a bounded lock-free multi-producer
 * ring (Dmitry Vyukov's bounded MPMC queue, used here with one consumer).
 *
 * Why this shape: producers are application threads in the middle of a data
 * structure update, so a push must never block or allocate — one CAS on the
 * tail and a release store of the cell's sequence number. The consumer (the
 * service thread, or a producer that found the ring full and applies the
 * queue itself) runs under the pool's apply_lock, so it needs no CAS.
 *
 * Cell protocol: cell i starts with seq = i. A producer that claimed
 * position pos writes the request, then publishes seq = pos + 1. The consumer
 * at position pos waits for seq == pos + 1, reads, and frees the cell for the
 * next lap with seq = pos + capacity. A producer preempted between claim and
 * publish only delays the consumer at that cell; the rest is taken next pass.
 */
#define NVH_PROTECT_INTERNALS_ 1
#include "protect.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

/* --------------------------------------------------------------------------
 * Setup
 * -------------------------------------------------------------------------- */
int pr_queue_init(pr_queue *q, unsigned slots)
{
    uint64_t cap = PR_QUEUE_MIN;
    while (cap < slots) cap <<= 1;
    size_t bytes = (size_t)cap * sizeof(pr_cell);
    void *cells = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (cells == MAP_FAILED)
        return nvh_fail_errno(NVH_E_NOMEM, errno, "cannot allocate a protection queue of %llu "
                              "slots", (unsigned long long)cap);
    q->cells = cells;
    q->mask = cap - 1;
    q->head = 0;
    atomic_init(&q->tail, 0);
    for (uint64_t i = 0; i < cap; i++) atomic_init(&q->cells[i].seq, i);
    return NVH_OK;
}

void pr_queue_fini(pr_queue *q)
{
    if (q->cells) munmap(q->cells, (size_t)(q->mask + 1) * sizeof(pr_cell));
    q->cells = NULL;
}

/* --------------------------------------------------------------------------
 * Producers
 * -------------------------------------------------------------------------- */
bool pr_queue_push(pr_queue *q, const pr_request *r)
{
    uint64_t pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
    for (;;) {
        pr_cell *cell = &q->cells[pos & q->mask];
        uint64_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
        int64_t dif = (int64_t)(seq - pos);
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&q->tail, &pos, pos + 1,
                                                      memory_order_relaxed,
                                                      memory_order_relaxed)) {
                cell->req = *r;
                atomic_store_explicit(&cell->seq, pos + 1, memory_order_release);
                return true;
            }
            /* pos was reloaded by the failed CAS */
        } else if (dif < 0) {
            return false;                 /* a full lap behind: the ring is full */
        } else {
            pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
        }
    }
}

/* --------------------------------------------------------------------------
 * The consumer (holds apply_lock)
 * -------------------------------------------------------------------------- */
size_t pr_queue_pop(pr_queue *q, pr_request *out, size_t max)
{
    size_t n = 0;
    while (n < max) {
        pr_cell *cell = &q->cells[q->head & q->mask];
        uint64_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
        if (seq != q->head + 1) break;    /* empty, or not yet published */
        out[n++] = cell->req;
        atomic_store_explicit(&cell->seq, q->head + q->mask + 1, memory_order_release);
        q->head++;
    }
    return n;
}
