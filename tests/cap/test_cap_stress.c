/* test_cap_stress.c — many threads allocating and freeing across threads on
 * one capacity instance, sizes 1 B - 64 MiB (log-distributed, the big ones
 * rare), every block checked before it is freed. Linked against the core
 * directly (not the preload library), so it runs under TSan as well. */
#include "test_util.h"
#include "cap_sizes.h"

#include "cap/cap.h"

#include <pthread.h>
#include <stdatomic.h>

#define THREADS 6
static unsigned nthreads = THREADS;
#define SLOTS 4096

static struct cap_inst cap;
static _Atomic(uintptr_t) slot[SLOTS];
static unsigned ops_per_thread = 60000;

struct hdr {
    size_t size;
    uint64_t tag;
};

/* cmocka's asserts must not fire on other threads: fail loudly instead */
#define CHECK(x)                                                              \
    do {                                                                      \
        if (!(x)) {                                                           \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #x); \
            abort();                                                          \
        }                                                                     \
    } while (0)

/* sizes: up to 64 KiB mostly, rarely to 128 MiB */
static size_t pick_size(uint64_t *s) { return cap_pick_size(s, 990, 999, 0, 26); }

static void check_and_free(void *p)
{
    struct hdr *h = p;
    size_t sz = h->size;
    if (sz >= sizeof *h) {
        CHECK((h->tag) == ((uint64_t)sz * 0x9E3779B97F4A7C15ull));
        if (sz > sizeof *h)
            CHECK((((unsigned char *)p)[sz - 1]) == ((unsigned char)sz));
    } else {
        CHECK((((unsigned char *)p)[0]) == ((unsigned char)(0xC0 | sz)));
    }
    CHECK(nvh_cap_usable_(&cap, p) >= sz);
    CHECK(nvh_cap_free_(&cap, p) == CAP_OK);
}

static void *worker(void *arg)
{
    uint64_t seed = (uintptr_t)arg * 0x2545F4914F6CDD1Dull + 1;
    struct cap_heap *h = nvh_cap_heap_(&cap);
    for (unsigned i = 0; i < ops_per_thread; i++) {
        size_t sz = pick_size(&seed) >> (cap_rnd(&seed) % 4 ? 4 : 0);
        if (!sz)
            sz = 1;
        unsigned char *p = cap_rnd(&seed) % 8 == 0 ? nvh_cap_alloc_aligned_(h, sz, (size_t)64 << (cap_rnd(&seed) % 8))
                                               : nvh_cap_alloc_(h, sz);
        CHECK(p != NULL);
        if (sz >= sizeof(struct hdr)) {
            struct hdr *hd = (struct hdr *)p;
            hd->size = sz;
            hd->tag = (uint64_t)sz * 0x9E3779B97F4A7C15ull;
            if (sz > sizeof *hd)
                p[sz - 1] = (unsigned char)sz;
        } else {
            /* tiny: the size lives in the first byte */
            p[0] = (unsigned char)(0xC0 | sz);
        }
        if (sz < sizeof(struct hdr)) {
            /* free tiny ones locally at once (their size is not recorded) */
            CHECK(nvh_cap_free_(&cap, p) == CAP_OK);
            continue;
        }
        uintptr_t old = atomic_exchange(&slot[cap_rnd(&seed) % SLOTS], (uintptr_t)p);
        if (old)
            check_and_free((void *)old);
    }
    return NULL;
}

static void test_stress(void **state)
{
    (void)state;
    const char *q = getenv("NVHEAP_TEST_QUICK");
    if (q && *q == '1')
        ops_per_thread /= 4;
    const char *nt = getenv("CAP_STRESS_THREADS");
    if (nt && atoi(nt) > 0 && atoi(nt) <= THREADS)
        nthreads = (unsigned)atoi(nt);
    assert_int_equal(nvh_cap_init_file_(&cap, "/dev/shm", (size_t)64 << 30), 0);
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < nthreads; i++)
        pthread_create(&t[i], NULL, worker, (void *)(i + 1));
    for (unsigned i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    for (unsigned i = 0; i < SLOTS; i++) {
        uintptr_t p = atomic_exchange(&slot[i], 0);
        if (p)
            check_and_free((void *)p);
    }
    nvh_cap_trim_(&cap);
    struct nvh_cap_counters c;
    nvh_cap_counters_(&cap, &c);
    /* everything was freed: the file keeps at most the caches of the heaps
     * drained by an orphan free and the small remote batches */
    assert_true(c.file_bytes < c.span_peak / 10 + ((size_t)4 << 20));
    nvh_cap_destroy_(&cap);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_stress)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
