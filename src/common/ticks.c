/* ticks.c — cheap timestamps for deadlines and latency figures: the
 * calibration of nvh_ticks() (internal.h) against CLOCK_MONOTONIC.
 *
 * Why not clock_gettime everywhere: under a paravirtual clock (kvm-clock)
 * it costs several times a TSC read, and the persist-group layer reads a clock
 * ~0.4 times per B+ tree insert (its batching deadline), the protection
 * layer at every window close that queues a page.
 */
#include "internal.h"

#include <errno.h>
#include <time.h>

double nvh_ns_per_tick = 1.0;
static pthread_once_t ticks_once = PTHREAD_ONCE_INIT;

/* TSC ticks against CLOCK_MONOTONIC over a 2 ms sleep, once per process
 * (constant-rate TSC assumed, as on every x86-64 of the last 15 years;
 * the figures feed batching deadlines and latency histograms, where 1 %
 * does not matter). */
static void ticks_calibrate_once(void)
{
#if NVH_TICKS_ARE_TSC
    uint64_t n0 = nvh_now_ns(), t0 = nvh_ticks();
    struct timespec d = {.tv_sec = 0, .tv_nsec = 2000000};
    while (nanosleep(&d, &d) != 0 && errno == EINTR) {}
    uint64_t n1 = nvh_now_ns(), t1 = nvh_ticks();
    if (t1 > t0 && n1 > n0) nvh_ns_per_tick = (double)(n1 - n0) / (double)(t1 - t0);
#endif
}

void nvh_ticks_calibrate(void)
{
    pthread_once(&ticks_once, ticks_calibrate_once);
}
