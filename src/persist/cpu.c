/* cpu.c — choosing how to persist: the flush instruction (runtime CPUID,
 * overridable by NVHEAP_FLUSH), the persistence domain (flag, NVHEAP_DOMAIN,
 * or detection), and the non-temporal copy threshold. */
#include "../common/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

/* --------------------------------------------------------------------------
 * Flush instruction
 * -------------------------------------------------------------------------- */
static bool cpu_has(nvh_flush_kind kind)
{
#if defined(__x86_64__)
    unsigned eax, ebx, ecx, edx;
    switch (kind) {
    case NVH_FLUSH_CLFLUSH:
        return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (edx & (1u << 19));
    case NVH_FLUSH_CLFLUSHOPT:
        return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ebx & bit_CLFLUSHOPT);
    case NVH_FLUSH_CLWB:
        return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ebx & bit_CLWB);
    default:
        return true;
    }
#else
    return kind == NVH_FLUSH_NONE;
#endif
}

/* The best instruction the CPU has, ignoring NVHEAP_FLUSH. */
static nvh_flush_kind cpu_best_kind(void)
{
    if (cpu_has(NVH_FLUSH_CLWB)) return NVH_FLUSH_CLWB;
    if (cpu_has(NVH_FLUSH_CLFLUSHOPT)) return NVH_FLUSH_CLFLUSHOPT;
    if (cpu_has(NVH_FLUSH_CLFLUSH)) return NVH_FLUSH_CLFLUSH;
    return NVH_FLUSH_NONE;
}

const char *nvh_flush_kind_name(nvh_flush_kind kind)
{
    switch (kind) {
    case NVH_FLUSH_CLWB: return "clwb";
    case NVH_FLUSH_CLFLUSHOPT: return "clflushopt";
    case NVH_FLUSH_CLFLUSH: return "clflush";
    case NVH_FLUSH_NONE: return "none";
    }
    return "none";
}

/* NVHEAP_FLUSH may only pick an instruction the CPU has: executing one it
 * lacks would be SIGILL, so an unsupported choice falls back to detection. */
nvh_flush_kind nvh_flush_kind_select(void)
{
    const char *env = getenv("NVHEAP_FLUSH");
    if (env && *env) {
        static const nvh_flush_kind kinds[] = {NVH_FLUSH_CLWB, NVH_FLUSH_CLFLUSHOPT,
                                               NVH_FLUSH_CLFLUSH};
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
            if (strcmp(env, nvh_flush_kind_name(kinds[i])) == 0 && cpu_has(kinds[i]))
                return kinds[i];
    }
    return cpu_best_kind();
}

/* Public: what a pmem-domain pool opened now would use, i.e. after
 * NVHEAP_FLUSH (as nvheap.h documents), not merely the CPU's best. */
nvh_flush_kind nvh_flush_kind_detect(void)
{
    return nvh_flush_kind_select();
}

uint64_t nvh_nt_threshold_default(void)
{
    const char *env = getenv("NVHEAP_NT_THRESHOLD");
    if (env && *env) {
        char *end;
        unsigned long long v = strtoull(env, &end, 10);
        if (*end == '\0') return v ? v : UINT64_MAX;  /* 0 disables NT copies */
    }
    return 256;
}

/* --------------------------------------------------------------------------
 * Domains
 * -------------------------------------------------------------------------- */
static const char *const domain_names[] = {"auto", "pmem", "eadr", "msync", "process", "sim"};

const char *nvh_domain_name(nvh_domain domain)
{
    if ((unsigned)domain < sizeof domain_names / sizeof domain_names[0])
        return domain_names[domain];
    return NULL;
}

int nvh_domain_parse(const char *name, nvh_domain *domain)
{
    if (!name || !domain) return nvh_fail(NVH_E_INVAL, "nvh_domain_parse: NULL argument");
    for (unsigned i = 0; i < sizeof domain_names / sizeof domain_names[0]; i++)
        if (strcmp(name, domain_names[i]) == 0) {
            *domain = (nvh_domain)i;
            return NVH_OK;
        }
    return nvh_fail(NVH_E_INVAL, "unknown persistence domain '%s' "
                    "(expected pmem, eadr, msync, process, sim or auto)", name);
}

int nvh_domain_resolve(unsigned flags, nvh_domain detected, nvh_domain *out)
{
    nvh_domain d = (nvh_domain)(flags & NVH_DOMAIN_MASK);
    if (d > NVH_DOMAIN_SIM) return nvh_fail(NVH_E_INVAL, "invalid domain %u in flags", (unsigned)d);
    if (d == NVH_DOMAIN_AUTO) {
        const char *env = getenv("NVHEAP_DOMAIN");
        if (env && *env) {
            int rc = nvh_domain_parse(env, &d);
            if (rc) return nvh_fail_context(rc, "NVHEAP_DOMAIN");
        }
    }
    if (d == NVH_DOMAIN_AUTO) d = detected;
    *out = d;
    return NVH_OK;
}

/* --------------------------------------------------------------------------
 * Statistics stripes: each thread adds to its own cache line of counters so
 * that two threads flushing the same pool do not bounce one line.
 * -------------------------------------------------------------------------- */
_Thread_local unsigned nvh_thread_stripe_ __attribute__((tls_model("initial-exec")));
static _Atomic unsigned next_stripe;

/* Counters are updated with a plain load + store (nvheap.h), so they are
 * exact only while no two live threads share a stripe. A thread therefore
 * takes a free stripe and gives it back when it exits; only when all
 * NVH_STAT_STRIPES are owned by live threads does a newcomer share one. */
static _Atomic uint32_t stripes_owned;        /* bit s-1: stripe s has an owner */
static pthread_key_t stripe_key;              /* value: the owned stripe (1-based) */
static pthread_once_t stripe_once = PTHREAD_ONCE_INIT;

static void stripe_release(void *value)
{
    unsigned s = (unsigned)(uintptr_t)value;
    atomic_fetch_and_explicit(&stripes_owned, ~(1u << (s - 1)), memory_order_relaxed);
    nvh_thread_stripe_ = 0;   /* counting later in this exit reassigns */
}

/* In a forked child only the forking thread lives on. */
static void stripe_atfork_child(void)
{
    unsigned s = (unsigned)(uintptr_t)pthread_getspecific(stripe_key);
    atomic_store_explicit(&stripes_owned, s ? 1u << (s - 1) : 0, memory_order_relaxed);
}

static void stripe_init(void)
{
    pthread_key_create(&stripe_key, stripe_release);
    pthread_atfork(NULL, NULL, stripe_atfork_child);
}

unsigned nvh_assign_stripe_(void)
{
    const uint32_t all = (1u << NVH_STAT_STRIPES) - 1;
    pthread_once(&stripe_once, stripe_init);
    unsigned s = 0;
    uint32_t owned = atomic_load_explicit(&stripes_owned, memory_order_relaxed);
    while ((owned & all) != all) {
        unsigned bit = (unsigned)__builtin_ctz(~owned & all);
        if (atomic_compare_exchange_weak_explicit(&stripes_owned, &owned, owned | (1u << bit),
                                                  memory_order_relaxed, memory_order_relaxed)) {
            s = bit + 1;
            pthread_setspecific(stripe_key, (void *)(uintptr_t)s);
            break;
        }
    }
    if (!s) s = 1 + atomic_fetch_add_explicit(&next_stripe, 1, memory_order_relaxed) %
                        NVH_STAT_STRIPES;
    nvh_thread_stripe_ = s;
    return s;
}

void nvh_stats_get(const nvh_pool *pool, nvh_stats *stats)
{
    uint64_t sum[NVH_STAT_COUNT_] = {0};
    if (!stats) return;
    if (!pool) {
        memset(stats, 0, sizeof *stats);
        return;
    }
    for (unsigned s = 0; s < NVH_STAT_STRIPES; s++)
        for (unsigned i = 0; i < NVH_STAT_COUNT_; i++)
            sum[i] += atomic_load_explicit(&pool->ctx.stats[s].value[i], memory_order_relaxed);
    stats->lines_flushed = sum[NVH_STAT_LINES];
    stats->fences = sum[NVH_STAT_FENCES];
    stats->msyncs = sum[NVH_STAT_MSYNCS];
    stats->nt_bytes = sum[NVH_STAT_NT_BYTES];
}

void nvh_stats_reset(nvh_pool *pool)
{
    if (!pool) return;
    for (unsigned s = 0; s < NVH_STAT_STRIPES; s++)
        for (unsigned i = 0; i < NVH_STAT_COUNT_; i++)
            atomic_store_explicit(&pool->ctx.stats[s].value[i], 0, memory_order_relaxed);
}
