/* service.c — the async protection service thread of a pool.
 *
 * It plays the part of [Moraru11]'s kernel thread (§7.2): sleep for the
 * interval, take everything queued, sort, coalesce, apply, sleep again. In
 * user space the sleep is a condition-variable wait on CLOCK_MONOTONIC with
 * the thread's timer slack set to 1 ns, so intervals of a few microseconds
 * are honoured (the default 50 us slack would round them all up).
 *
 * The thread blocks every asynchronous signal: the application's signals
 * (SIGINT, SIGALRM, ...) must go to its own threads, not to ours.
 */
#define NVH_PROTECT_INTERNALS_ 1
#include "protect.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

/* --------------------------------------------------------------------------
 * The loop
 * -------------------------------------------------------------------------- */
static void deadline_after(struct timespec *ts, uint64_t ns)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    uint64_t t = (uint64_t)ts->tv_nsec + ns;
    ts->tv_sec += (time_t)(t / 1000000000u);
    ts->tv_nsec = (long)(t % 1000000000u);
}

static void *service_main(void *arg)
{
    struct nvh_protect *pr = arg;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    pthread_setname_np(pthread_self(), "nvh-protect");
    pthread_mutex_lock(&pr->wake_lock);
    while (!atomic_load(&pr->stop)) {
        struct timespec deadline;
        deadline_after(&deadline, atomic_load_explicit(&pr->interval_ns, memory_order_relaxed));
        int rc = 0;
        while (!atomic_load(&pr->stop) && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&pr->wake, &pr->wake_lock, &deadline);
        pthread_mutex_unlock(&pr->wake_lock);

        /* a new pass: the window caches give their units back (their
         * owners at their next call; idle owners' units are taken here) */
        pr_tc_pass(pr);
        pthread_mutex_lock(&pr->apply_lock);
        pr_drain(pr, false);
        pthread_mutex_unlock(&pr->apply_lock);

        pthread_mutex_lock(&pr->wake_lock);
    }
    pthread_mutex_unlock(&pr->wake_lock);
    return NULL;
}

/* --------------------------------------------------------------------------
 * Start / stop / wake
 * -------------------------------------------------------------------------- */
int pr_service_start(struct nvh_protect *pr)
{
    if (pr->thread_running) return NVH_OK;
    atomic_store(&pr->stop, false);
    sigset_t all, old;
    sigfillset(&all);
    /* synchronous signals cannot usefully be blocked; leave them */
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&pr->thread, NULL, service_main, pr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e != 0)
        return nvh_fail_errno(NVH_E_NOMEM, e, "cannot start the protection service thread");
    pr->thread_running = true;
    return NVH_OK;
}

void pr_service_kick(struct nvh_protect *pr)
{
    pthread_mutex_lock(&pr->wake_lock);
    pthread_cond_signal(&pr->wake);
    pthread_mutex_unlock(&pr->wake_lock);
}

/* Stop and join; whatever is still queued is applied by the caller after. */
void pr_service_stop(struct nvh_protect *pr)
{
    if (!pr->thread_running) return;
    pthread_mutex_lock(&pr->wake_lock);
    atomic_store(&pr->stop, true);
    pthread_cond_signal(&pr->wake);
    pthread_mutex_unlock(&pr->wake_lock);
    pthread_join(pr->thread, NULL);
    pr->thread_running = false;
}
