/* epoch.c — epoch-based reclamation for lock-free readers (process-wide).
 *
 * A container whose readers take no lock (the hash map) must not let the
 * memory of an entry it unlinked be reused while a reader may still be
 * looking at it. Readers announce themselves: nvh_epoch_enter_ stores the
 * global epoch into the thread's slot, nvh_epoch_exit_ clears it.
 *
 * The allocator's don't-allocate FIFO holds freed space back (alloc/fifo.c).
 * Its drain runs under the arena lock, so every free it considers happened
 * before it (the free's unlink included). The drain first scans the slots
 * (nvh_epoch_min_active_, a seq_cst fence, then the loads):
 *   - a reader the scan does not see announced after the fence in the
 *     seq_cst order, so its loads of links see every unlink that happened
 *     before the drain: no entry is held for it;
 *   - for a reader the scan sees, the drain stamps every entry not stamped
 *     yet with nvh_epoch_now_() (a read-modify-write after the unlinks) and
 *     hands space out only once every such reader announced an epoch above
 *     the stamp: that reader loaded the global epoch from a later advance,
 *     which continues the stamp's release sequence, so it sees the unlink
 *     and cannot reach the object.
 * So frees touch no shared line at all (the stamp is the drain's, once per
 * batch, and only while some reader is in), and the global epoch moves on
 * only when the drain finds a stamped entry held back (nvh_epoch_advance_).
 * Readers cost one fenced store in and one store out.
 *
 * Process-wide, not per pool: the callers (the hash map, the sorted store,
 * object transactions, the allocator's drain) pass no pool, and a thread may
 * be a reader of one pool while it calls into another (a transaction using
 * a store), which one slot per thread and pool could not express. The cost:
 * a reader holds back reuse of space freed after it entered in every pool.
 * Container readers are in for one call; an object transaction is in from
 * its first open to its end, so a long one holds back every pool's reuse
 * (docs/TX.md, "Freed memory", states the rule for callers).
 *
 * Slots are per thread (NVH_EPOCH_SLOTS, cache-line padded), claimed at a
 * thread's first read and released when it exits. */
#include "internal.h"

#include <sched.h>
#include <stdatomic.h>

#define NVH_EPOCH_SLOTS 1024u

typedef struct epoch_slot {
    _Atomic uint64_t epoch;        /* 0: not reading                         */
    _Atomic uint32_t taken;        /* claimed by a live thread               */
    char pad[64 - 12];
} epoch_slot;
static_assert(sizeof(epoch_slot) == 64, "one line per slot");

static epoch_slot slots[NVH_EPOCH_SLOTS] __attribute__((aligned(64)));
static _Atomic uint64_t global_epoch = 2;
static _Atomic uint32_t slots_hw;          /* slots ever claimed: scan bound */

static _Thread_local struct {
    int idx;                       /* -1: no slot yet                        */
    unsigned depth;                /* nesting of enter/exit                   */
} self __attribute__((tls_model("initial-exec"))) = {-1, 0};  /* no __tls_get_addr call */

static pthread_key_t release_key;
static pthread_once_t release_once = PTHREAD_ONCE_INIT;

static void epoch_release(void *arg)
{
    epoch_slot *s = arg;
    atomic_store_explicit(&s->epoch, 0, memory_order_release);
    atomic_store_explicit(&s->taken, 0, memory_order_release);
}

static void epoch_key_init(void) { pthread_key_create(&release_key, epoch_release); }

static __attribute__((noinline)) void epoch_claim(void)
{
    pthread_once(&release_once, epoch_key_init);
    for (;;) {
        for (uint32_t i = 0; i < NVH_EPOCH_SLOTS; i++) {
            uint32_t free_ = 0;
            if (atomic_load_explicit(&slots[i].taken, memory_order_relaxed) == 0 &&
                atomic_compare_exchange_strong(&slots[i].taken, &free_, 1)) {
                uint32_t hw = atomic_load(&slots_hw);
                while (hw < i + 1 && !atomic_compare_exchange_weak(&slots_hw, &hw, i + 1)) {}
                self.idx = (int)i;
                pthread_setspecific(release_key, &slots[i]);
                return;
            }
        }
        sched_yield();             /* more reading threads than slots: wait */
    }
}

void nvh_epoch_enter_(void)
{
    if (self.depth++) return;
    if (__builtin_expect(self.idx < 0, 0)) epoch_claim();
    uint64_t e = atomic_load_explicit(&global_epoch, memory_order_acquire);
    /* The store, then a seq_cst fence, pairs with the fence in
     * nvh_epoch_min_active_ (store-buffering by fences, C11 7.17.4): either
     * the drain's slot scan sees this announcement, or this reader's later
     * loads of links see every unlink the drain's caller made. A seq_cst
     * store alone would not order the reader's later acquire loads in C11
     * (x86 happens to); the fence costs the same locked/fenced store. */
    atomic_store_explicit(&slots[self.idx].epoch, e, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
}

void nvh_epoch_exit_(void)
{
    if (--self.depth) return;
    atomic_store_explicit(&slots[self.idx].epoch, 0, memory_order_release);
}

/* A read-modify-write, not a load: it orders the unlinks that happened
 * before the caller ahead of the stamp even on x86, whose store buffer lets
 * a plain load pass an earlier store, and it heads a release sequence that
 * every later advance continues: a reader whose announced epoch came from
 * a later advance synchronises with it, so it sees the unlinks. It writes
 * the global line, so the allocator calls it once per drain, not per free. */
uint64_t nvh_epoch_now_(void)
{
    return atomic_fetch_add_explicit(&global_epoch, 0, memory_order_acq_rel);
}

void nvh_epoch_advance_(void)
{
    atomic_fetch_add_explicit(&global_epoch, 1, memory_order_seq_cst);
}

uint64_t nvh_epoch_min_active_(void)
{
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t min = UINT64_MAX;
    uint32_t hw = atomic_load_explicit(&slots_hw, memory_order_acquire);
    for (uint32_t i = 0; i < hw; i++) {
        uint64_t e = atomic_load_explicit(&slots[i].epoch, memory_order_acquire);
        if (e && e < min) min = e;
    }
    return min;
}
