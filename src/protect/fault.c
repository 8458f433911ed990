/* fault.c — the SIGSEGV handler: finishes queued unprotects, opens the
 * implicit windows of library code, reports stray writes, and passes every
 * other fault on to the handler that was there before.
 *
 * Async-signal safety: the handler only reads the registry and the pool's
 * arrays with lock-free atomics, calls mprotect(2), write(2), sigaction(2),
 * raise(3) and abort(3), and formats numbers by hand. It never takes a lock
 * and never allocates, so it may interrupt any code, ours included (a
 * producer between its count update and its queue push, the service thread
 * in the middle of a pass).
 *
 * Finding a pool without locks: a fixed table of PR_REGISTRY_SLOTS atomic
 * pointers; a fault scans it for the pool whose mapping holds the address.
 * Removal (mode off, close) clears the slot, then waits until no handler is
 * running (handlers_active) before the caller frees anything: a handler that
 * incremented the counter before the clear is waited for, one that
 * incremented it after finds the slot empty.
 *
 * The handler as an applier (see protect.h): it makes a page writable only
 * when a window is open on it (count > 0) or the thread is inside an implicit
 * window, and after storing the state bit it re-reads the count. If the count
 * went to 0 meanwhile (a window of ANOTHER thread closed between our check
 * and our mprotect: this thread's store had no window of its own), it
 * re-protects the page; the store faults again and is judged again.
 */
#define NVH_PROTECT_INTERNALS_ 1
#include "protect.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* --------------------------------------------------------------------------
 * Registry
 * -------------------------------------------------------------------------- */
static struct nvh_protect *_Atomic registry[PR_REGISTRY_SLOTS];
static _Atomic unsigned handlers_active;

int pr_registry_add(struct nvh_protect *pr)
{
    for (unsigned i = 0; i < PR_REGISTRY_SLOTS; i++) {
        struct nvh_protect *expected = NULL;
        if (atomic_compare_exchange_strong(&registry[i], &expected, pr)) {
            pr->registry_slot = (int)i;
            return NVH_OK;
        }
    }
    return nvh_fail(NVH_E_BUSY, "cannot protect pool %s: %u pools are protected already "
                    "(the most at once)", pr->pool->path, PR_REGISTRY_SLOTS);
}

void pr_registry_remove(struct nvh_protect *pr)
{
    if (pr->registry_slot < 0) return;
    atomic_store(&registry[pr->registry_slot], NULL);
    pr->registry_slot = -1;
    while (atomic_load(&handlers_active) != 0) sched_yield();
}

static struct nvh_protect *registry_find(uintptr_t addr)
{
    for (unsigned i = 0; i < PR_REGISTRY_SLOTS; i++) {
        struct nvh_protect *pr = atomic_load(&registry[i]);
        if (!pr) continue;
        uintptr_t base = (uintptr_t)pr->base;
        uint64_t size = atomic_load_explicit(&pr->pool->ctx.size, memory_order_acquire);
        if (addr >= base && addr - base < size) return pr;
    }
    return NULL;
}

/* --------------------------------------------------------------------------
 * Message formatting without stdio
 * -------------------------------------------------------------------------- */
typedef struct msgbuf { char text[1024]; size_t len; } msgbuf;

static void put_str(msgbuf *m, const char *s)
{
    while (s && *s && m->len < sizeof m->text - 1) m->text[m->len++] = *s++;
}

static void put_hex(msgbuf *m, uint64_t v)
{
    char tmp[19];
    int n = 0;
    do { tmp[n++] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v);
    put_str(m, "0x");
    while (n > 0 && m->len < sizeof m->text - 1) m->text[m->len++] = tmp[--n];
}

static void put_dec(msgbuf *m, uint64_t v)
{
    char tmp[21];
    int n = 0;
    do { tmp[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (n > 0 && m->len < sizeof m->text - 1) m->text[m->len++] = tmp[--n];
}

static const char *mode_name(int mode)
{
    return mode == NVH_PROTECT_SYNC ? "sync" : mode == NVH_PROTECT_ASYNC ? "async" : "off";
}

static void report_and_abort(const nvh_stray_info *info)
{
    msgbuf m = {.len = 0};
    put_str(&m, "nvheap: stray write to protected pool memory at ");
    put_hex(&m, (uint64_t)(uintptr_t)info->addr);
    put_str(&m, " (pool ");
    put_str(&m, info->path);
    put_str(&m, ", offset ");
    put_hex(&m, info->offset);
    put_str(&m, ", page ");
    put_dec(&m, info->offset >> PR_PAGE_SHIFT);
    put_str(&m, ", protection ");
    put_str(&m, mode_name(info->mode));
    put_str(&m, "): no write window is open on this page; aborting\n");
    ssize_t ignored = write(STDERR_FILENO, m.text, m.len);
    (void)ignored;
    abort();
}

/* --------------------------------------------------------------------------
 * Making a page writable from the handler
 * -------------------------------------------------------------------------- */
/* mprotect, then the hfault bit, then fault_seq, then the state bit: the
 * order apply.c's reconcile() relies on to notice a handler racing with its
 * pass, and to redo only the pages such a handler touched. */
static void make_writable(struct nvh_protect *pr, uint64_t page)
{
    pr_mprotect(pr, page, 1, true);
    pr_bit_set(pr->hfault, page);
    atomic_fetch_add(&pr->fault_seq, 1);
    pr_bit_set(pr->state, page);
}

/* A window is open on the page: usually a queued unprotect the service has
 * not reached yet. The neighbours that are in the same situation (window
 * open, not yet writable: a multi-page record, a slab opened ahead) are
 * made writable in the same mprotect, up to PR_FAULT_RUN pages (4 MiB: the
 * B+ tree's 1 MiB slab with its header and the page after it is 258): each of
 * them would otherwise cost a fault of its own a moment later. Every page
 * of the run then goes through the same re-check. */
#define PR_FAULT_RUN 1024u
static bool needs_opening(struct nvh_protect *pr, uint64_t page)
{
    return pr_page_wanted(pr, page) && !pr_bit_test(pr->state, page);
}

static void resolve_open_window(struct nvh_protect *pr, uint64_t page)
{
    uint64_t lo = page, hi = page + 1, mapped = pr_mapped_pages(pr);
    while (lo > 0 && hi - lo < PR_FAULT_RUN && needs_opening(pr, lo - 1)) lo--;
    while (hi < mapped && hi - lo < PR_FAULT_RUN && needs_opening(pr, hi)) hi++;
    pr_mprotect(pr, lo, hi - lo, true);
    for (uint64_t p = lo; p < hi; p++) pr_bit_set(pr->hfault, p);
    atomic_fetch_add(&pr->fault_seq, 1);
    for (uint64_t p = lo; p < hi; p++) pr_bit_set(pr->state, p);
    pr_stat(pr, ST_FAULTS_RESOLVED, 1);
#ifdef MADV_POPULATE_WRITE
    /* A run of several pages is fresh memory opened in bulk (a record slab,
     * a batch of nodes: never written, so not mapped yet): map it now in
     * one call rather than with one page-fault trap per page on the way
     * (a trap costs far more than mapping the page in the call). The pages
     * are writable and have a window open; contents are unchanged. A page
     * whose window closed meanwhile is re-protected below either way. */
    if (hi - lo > 1 && pr->populate)
        (void)madvise(pr_page_addr(pr, lo), (size_t)(hi - lo) << PR_PAGE_SHIFT, MADV_POPULATE_WRITE);
#endif
    for (uint64_t p = lo; p < hi; p++) {
        if (!pr_page_wanted(pr, p)) {          /* the re-check, see the top */
            /* Leave the state bit set: "bit 1, really read-only" only costs a
             * later fault, while clearing it could race with another handler's
             * make_writable and hide a writable page behind a 0 bit. */
            pr_mprotect(pr, p, 1, false);
        }
    }
}

/* The thread is inside nvh_protect_internal_begin/end: open a window on the
 * page for it, remembered in its thread-local list and closed at _end. If the
 * list is full the page is made writable without a window and _end asks the
 * service for a sweep, which re-protects every writable page without one. */
static void open_internal_window(struct nvh_protect *pr, uint64_t page, pr_tls *tls)
{
    pr_tls_list *l = tls->list;
    if (l && l->n < PR_TLS_PAGES) {
        atomic_fetch_add(&pr->count[page], 1);
        l->pages[l->n].pr = pr;
        l->pages[l->n].page = page;
        l->n++;
    } else if (l) {
        l->overflow = true;
    } else {
        tls->lost = true;                     /* no list (out of memory) */
    }
    make_writable(pr, page);
    pr_stat(pr, ST_INTERNAL_FAULTS, 1);
}

static bool in_window_pools(const pr_tls *tls, const nvh_pool *pool)
{
    const pr_tls_list *l = tls->list;
    if (!l || l->any_pool) return true;
    for (unsigned i = 0; i < l->npools && i < PR_TLS_POOLS; i++)
        if (l->pools[i] == pool) return true;
    return false;
}

/* --------------------------------------------------------------------------
 * The handler
 * -------------------------------------------------------------------------- */
/* The handler that was there before ours. Re-installing (see
 * pr_handler_install) writes the other buffer and then flips the index, so a
 * handler running meanwhile reads a complete one. */
static struct sigaction previous_buf[2];
static _Atomic int previous_idx;
static pthread_mutex_t install_lock = PTHREAD_MUTEX_INITIALIZER;
/* Set while this thread runs the previous handler: if that handler chains
 * back to us (it was installed after us and saved ours), we must not call it
 * again, or a foreign fault would recurse forever. */
static _Thread_local int in_chain __attribute__((tls_model("initial-exec")));

enum { NOT_OURS, HANDLED };

static int handle_pool_fault(void *addr)
{
    struct nvh_protect *pr = registry_find((uintptr_t)addr);
    if (!pr) return NOT_OURS;
    uint64_t page = (uint64_t)((char *)addr - pr->base) >> PR_PAGE_SHIFT;

    if (atomic_load(&pr->disabling)) {          /* switching off: all legal */
        make_writable(pr, page);
        return HANDLED;
    }
    if (pr_page_wanted(pr, page)) {
        resolve_open_window(pr, page);
        return HANDLED;
    }
    pr_tls *tls = &nvh_protect_tls_;
    if (tls->depth > 0 && in_window_pools(tls, pr->pool)) {
        open_internal_window(pr, page, tls);
        return HANDLED;
    }

    /* a stray write */
    pr_stat(pr, ST_STRAYS, 1);
    nvh_stray_info info = {
        .pool = pr->pool, .addr = addr, .offset = (uint64_t)((char *)addr - pr->base),
        .path = pr->pool->path, .mode = (nvh_protect_mode)atomic_load(&pr->mode),
    };
    nvh_stray_handler fn = atomic_load(&pr->stray_fn);
    if (!fn) report_and_abort(&info);
    void *arg = atomic_load(&pr->stray_arg);
    /* The application's handler may siglongjmp out: leave the registry's
     * reader count first, and look the pool up again if it returns. */
    atomic_fetch_sub(&handlers_active, 1);
    nvh_stray_action action = fn(&info, arg);
    atomic_fetch_add(&handlers_active, 1);
    if (action != NVH_STRAY_ALLOW) report_and_abort(&info);
    pr = registry_find((uintptr_t)addr);
    if (!pr) return HANDLED;                     /* turned off meanwhile: retry */
    atomic_fetch_add(&pr->count[page], 1);       /* the window ALLOW opens */
    make_writable(pr, page);
    return HANDLED;
}

static void chain(int sig, siginfo_t *si, void *uc)
{
    const struct sigaction *previous = &previous_buf[atomic_load(&previous_idx)];
    if (in_chain) previous = NULL;             /* looped back: default action */
    if (previous && (previous->sa_flags & SA_SIGINFO) && previous->sa_sigaction) {
        in_chain = 1;
        previous->sa_sigaction(sig, si, uc);
        in_chain = 0;
        return;
    }
    if (!previous || previous->sa_handler == SIG_DFL || previous->sa_handler == SIG_IGN) {
        /* Default action: put it back and let the signal happen again. A
         * fault re-executes the instruction on return and kills the process
         * the usual way (core dump and all); a SIGSEGV sent with kill() is
         * re-raised, blocked until we return. (SIG_IGN cannot survive a real
         * fault either: the kernel forces the default then.) */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, NULL);
        if (si->si_code <= 0) raise(sig);
        return;
    }
    in_chain = 1;
    previous->sa_handler(sig);
    in_chain = 0;
}

static void segv_handler(int sig, siginfo_t *si, void *uc)
{
    int saved_errno = errno;
    if (si->si_code == SEGV_ACCERR) {
        atomic_fetch_add(&handlers_active, 1);
        int r = handle_pool_fault(si->si_addr);
        atomic_fetch_sub(&handlers_active, 1);
        if (r == HANDLED) {
            errno = saved_errno;
            return;
        }
    }
    errno = saved_errno;
    chain(sig, si, uc);
}

/* Install, or re-install if another handler replaced ours since (test
 * frameworks such as cmocka set their own around each test; a crash reporter
 * may install one without chaining). Called each time protection is turned
 * on. Never uninstalled: that would break the chain of any handler installed
 * after ours; with no pool registered it only forwards. */
int pr_handler_install(void)
{
    int rc = NVH_OK;
    pthread_mutex_lock(&install_lock);
    struct sigaction cur;
    if (sigaction(SIGSEGV, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) &&
        cur.sa_sigaction == segv_handler) {
        pthread_mutex_unlock(&install_lock);
        return NVH_OK;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    int next = 1 - atomic_load(&previous_idx);
    if (sigaction(SIGSEGV, &sa, &previous_buf[next]) != 0) {
        rc = nvh_fail_errno(NVH_E_NOTSUP, errno, "cannot install the SIGSEGV handler for "
                            "write protection");
    } else if (sigaction(SIGSEGV, NULL, &cur) != 0 || !(cur.sa_flags & SA_SIGINFO) ||
               cur.sa_sigaction != segv_handler) {
        /* AddressSanitizer with allow_user_segv_handler=0 keeps its own */
        rc = nvh_fail(NVH_E_NOTSUP, "the SIGSEGV handler for write protection did not take "
                      "effect (a runtime keeps its own; with AddressSanitizer set "
                      "ASAN_OPTIONS=allow_user_segv_handler=1)");
    } else {
        atomic_store(&previous_idx, next);
    }
    pthread_mutex_unlock(&install_lock);
    return rc;
}
