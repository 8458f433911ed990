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
 * its first open (nvh_tx_run: its begin) to its end, so a long one holds
 * back every pool's reuse
 * (docs/TX.md, "Freed memory", states the rule for callers).
 *
 * Slots are per thread (NVH_EPOCH_SLOTS, cache-line padded), claimed at a
 * thread's first read and released when it exits.
 *
 * Sticky readers (nvh_epoch_enter_sticky_: object transactions, one read
 * section per transaction, back to back). The fenced store is what a read
 * section costs most (a LOCKed instruction per section). A sticky reader
 * keeps its slot announced when it leaves, so its next section needs no
 * fence: it marks itself busy (a plain store), checks that its slot was not
 * revoked, and raises its epoch to the global one with a plain store. That
 * is safe while the slot stays announced: a scan sees the old (smaller)
 * epoch, which holds more, or the new one, which the reader loaded from
 * an advance that continues the stamps' release sequence, so it sees every
 * unlink stamped below it. An announced reader that went idle would hold
 * freed space forever, so a scan revokes slots that are idle and stale
 * (busy clear, epoch NVH_EPOCH_STALE advances behind): it marks them
 * revoked, runs an asymmetric fence (membarrier: every running thread of
 * the process executes a full barrier), then clears the epoch of each whose
 * busy flag is still clear. Dekker's pattern with the reader's half fenced
 * by the system call: either the scan sees the reader busy (and keeps it),
 * or the reader sees the revocation and announces afresh with the fence.
 * Without membarrier (old kernels, valgrind) sticky readers are plain
 * ones. */
#include "internal.h"

#include <linux/membarrier.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NVH_EPOCH_SLOTS 1024u

typedef struct epoch_slot {
    _Atomic uint64_t epoch;        /* 0: not reading                         */
    _Atomic uint32_t taken;        /* claimed by a live thread               */
    _Atomic uint32_t sticky;       /* announced between sections (sticky)    */
    _Atomic uint32_t busy;         /* sticky: inside a section               */
    _Atomic uint32_t revoked;      /* sticky: a scan asks to announce afresh */
    char pad[64 - 24];
} epoch_slot;
static_assert(sizeof(epoch_slot) == 64, "one line per slot");

static epoch_slot slots[NVH_EPOCH_SLOTS] __attribute__((aligned(64)));
static _Atomic uint64_t global_epoch = 2;
static _Atomic uint32_t slots_hw;          /* slots ever claimed: scan bound */

static _Thread_local struct {
    int idx;                       /* -1: no slot yet                        */
    unsigned depth;                /* nesting of enter/exit                   */
    bool sticky;                   /* slot announced since a fenced store     */
} self __attribute__((tls_model("initial-exec"))) = {-1, 0, false};  /* no __tls_get_addr call */

/* A sticky slot this many advances behind, and idle, is revoked by a scan. */
#define NVH_EPOCH_STALE 64u

static _Atomic int sticky_ok;      /* 1: membarrier registered; -1: not available */
static pthread_once_t sticky_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t revoke_lock = PTHREAD_MUTEX_INITIALIZER;
int nvh_epoch_test_no_revoke_ = 0;

static pthread_key_t release_key;
static pthread_once_t release_once = PTHREAD_ONCE_INIT;

static void epoch_release(void *arg)
{
    epoch_slot *s = arg;
    atomic_store_explicit(&s->sticky, 0, memory_order_relaxed);
    atomic_store_explicit(&s->busy, 0, memory_order_relaxed);
    atomic_store_explicit(&s->epoch, 0, memory_order_release);
    atomic_store_explicit(&s->taken, 0, memory_order_release);
}

static void sticky_init(void)
{
    long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0);
    bool ok = q > 0 && (q & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
              syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0) == 0;
    atomic_store(&sticky_ok, ok ? 1 : -1);
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
    if (self.sticky) {
        /* a plain section ends the sticky announcement first: scans revoke
         * only sticky slots, and this section does not mark itself busy */
        self.sticky = false;
        atomic_store_explicit(&slots[self.idx].sticky, 0, memory_order_relaxed);
    }
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
    /* out: a sticky announcement ends here too (the next sticky section
     * must announce with the fence) */
    if (self.sticky) {
        self.sticky = false;
        atomic_store_explicit(&slots[self.idx].sticky, 0, memory_order_relaxed);
        atomic_store_explicit(&slots[self.idx].busy, 0, memory_order_relaxed);
    }
    atomic_store_explicit(&slots[self.idx].epoch, 0, memory_order_release);
}

static __attribute__((noinline)) void sticky_announce(void)
{
    if (__builtin_expect(self.idx < 0, 0)) epoch_claim();
    pthread_once(&sticky_once, sticky_init);
    epoch_slot *s = &slots[self.idx];
    if (atomic_load_explicit(&sticky_ok, memory_order_relaxed) != 1) {
        /* no asymmetric fence: a plain section */
        uint64_t e = atomic_load_explicit(&global_epoch, memory_order_acquire);
        atomic_store_explicit(&s->epoch, e, memory_order_relaxed);
        atomic_thread_fence(memory_order_seq_cst);
        return;
    }
    atomic_store_explicit(&s->busy, 1, memory_order_relaxed);
    atomic_store_explicit(&s->revoked, 0, memory_order_relaxed);
    atomic_store_explicit(&s->sticky, 1, memory_order_relaxed);
    uint64_t e = atomic_load_explicit(&global_epoch, memory_order_acquire);
    atomic_store_explicit(&s->epoch, e, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);   /* as nvh_epoch_enter_ */
    self.sticky = true;
}

void nvh_epoch_enter_sticky_(void)
{
    if (self.depth++) return;
    if (__builtin_expect(!self.sticky, 0)) {
        sticky_announce();
        return;
    }
    epoch_slot *s = &slots[self.idx];
    /* busy, then the revocation check: the scan's membarrier orders the
     * pair against its own (revoke, barrier, busy) */
    atomic_store_explicit(&s->busy, 1, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst);
    if (__builtin_expect(atomic_load_explicit(&s->revoked, memory_order_relaxed) != 0, 0)) {
        sticky_announce();
        return;
    }
    /* still announced: raising the epoch needs no fence (header) */
    uint64_t e = atomic_load_explicit(&global_epoch, memory_order_acquire);
    if (atomic_load_explicit(&s->epoch, memory_order_relaxed) != e)
        atomic_store_explicit(&s->epoch, e, memory_order_relaxed);
}

void nvh_epoch_exit_sticky_(void)
{
    if (--self.depth) return;
    if (!self.sticky) {                          /* a plain section (no membarrier) */
        atomic_store_explicit(&slots[self.idx].epoch, 0, memory_order_release);
        return;
    }
    /* announced still; idle (the reads of the section happen before) */
    atomic_store_explicit(&slots[self.idx].busy, 0, memory_order_release);
}

/* Revoke sticky slots that are idle and NVH_EPOCH_STALE advances behind g
 * (a scan's caller; at most one revocation round at a time). */
static void revoke_stale(uint64_t g, uint32_t hw)
{
    if (pthread_mutex_trylock(&revoke_lock) != 0) return;
    uint32_t cand[NVH_EPOCH_SLOTS];
    uint64_t seen[NVH_EPOCH_SLOTS];
    uint32_t n = 0;
    for (uint32_t i = 0; i < hw; i++) {
        uint64_t e = atomic_load_explicit(&slots[i].epoch, memory_order_relaxed);
        if (e && e + NVH_EPOCH_STALE <= g && atomic_load_explicit(&slots[i].sticky, memory_order_relaxed) &&
            !atomic_load_explicit(&slots[i].busy, memory_order_relaxed)) {
            atomic_store_explicit(&slots[i].revoked, 1, memory_order_relaxed);
            cand[n] = i;
            seen[n++] = e;
        }
    }
    if (n && syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) == 0) {
        atomic_thread_fence(memory_order_seq_cst);
        for (uint32_t k = 0; k < n; k++) {
            epoch_slot *s = &slots[cand[k]];
            uint64_t e = seen[k];
            /* still idle after every thread's barrier: its next section sees
             * the revocation, so it is out now */
            if (!atomic_load_explicit(&s->busy, memory_order_relaxed) &&
                atomic_load_explicit(&s->sticky, memory_order_relaxed))
                atomic_compare_exchange_strong(&s->epoch, &e, 0);
        }
    }
    pthread_mutex_unlock(&revoke_lock);
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
    /* an idle sticky reader far behind holds space it will never read */
    if (min != UINT64_MAX && atomic_load_explicit(&sticky_ok, memory_order_relaxed) == 1 &&
        !nvh_epoch_test_no_revoke_) {
        uint64_t g = atomic_load_explicit(&global_epoch, memory_order_acquire);
        if (min + NVH_EPOCH_STALE <= g) {
            revoke_stale(g, hw);
            min = UINT64_MAX;
            for (uint32_t i = 0; i < hw; i++) {
                uint64_t e = atomic_load_explicit(&slots[i].epoch, memory_order_acquire);
                if (e && e < min) min = e;
            }
        }
    }
    return min;
}
