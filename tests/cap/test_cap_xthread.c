/* test_cap_xthread.c — cross-thread frees and reallocs on one capacity
 * instance: producers allocate (sizes 32 B - 64 MiB, log-distributed, the big
 * ones rare) and hand blocks through a queue to consumers, which check
 * them, sometimes grow them by realloc, and free them. So every free of a
 * producer's block is a cross-thread free (full batches, batches cut short
 * by a change of owner, and frees into the heaps of producers that have
 * exited), producers only receive batches (their spare batches overflow
 * back to the instance), and one consumer never allocates (it has no heap:
 * its frees are pushed one block at a time). Linked against the core
 * directly, so it runs under TSan as well. */
#include "test_util.h"
#include "cap_sizes.h"

#include "cap/cap.h"

#include <pthread.h>
#include <stdatomic.h>

#define PRODUCERS 3
#define CONSUMERS 3
#define QSIZE 1024

static struct cap_inst cap;
static unsigned per_producer = 40000;

/* a bounded queue of blocks (mutex + condition variables: simple, and the
 * hand-off is what TSan should see as the only synchronisation) */
static void *q[QSIZE];
static unsigned qhead, qtail, qcount, producers_left = PRODUCERS;
static pthread_mutex_t qlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qnot_full = PTHREAD_COND_INITIALIZER, qnot_empty = PTHREAD_COND_INITIALIZER;

#define CHECK(x)                                                              \
    do {                                                                      \
        if (!(x)) {                                                           \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #x); \
            abort();                                                          \
        }                                                                     \
    } while (0)

struct hdr {
    size_t size;
    uint64_t tag;
};

/* sizes: 32 B .. 64 KiB mostly (room for the header), rarely to 64 MiB */
static size_t pick_size(uint64_t *s) { return cap_pick_size(s, 985, 998, 5, 25); }

static void put(void *p)
{
    pthread_mutex_lock(&qlock);
    while (qcount == QSIZE)
        pthread_cond_wait(&qnot_full, &qlock);
    q[qtail] = p;
    qtail = (qtail + 1) % QSIZE;
    qcount++;
    pthread_cond_signal(&qnot_empty);
    pthread_mutex_unlock(&qlock);
}

static void *get(void)
{
    pthread_mutex_lock(&qlock);
    while (qcount == 0 && producers_left)
        pthread_cond_wait(&qnot_empty, &qlock);
    void *p = NULL;
    if (qcount) {
        p = q[qhead];
        qhead = (qhead + 1) % QSIZE;
        qcount--;
        pthread_cond_signal(&qnot_full);
    }
    pthread_mutex_unlock(&qlock);
    return p;
}

static void stamp(unsigned char *p, size_t sz)
{
    struct hdr *h = (struct hdr *)p;
    h->size = sz;
    h->tag = (uint64_t)sz * 0x9E3779B97F4A7C15ull;
    p[sz - 1] = (unsigned char)sz;
}

static void check(const unsigned char *p)
{
    const struct hdr *h = (const struct hdr *)p;
    CHECK(h->tag == (uint64_t)h->size * 0x9E3779B97F4A7C15ull);
    CHECK(p[h->size - 1] == (unsigned char)h->size);
    CHECK(nvh_cap_usable_(&cap, p) >= h->size);
}

static void *producer(void *arg)
{
    uint64_t seed = (uintptr_t)arg * 0x2545F4914F6CDD1Dull + 7;
    struct cap_heap *h = nvh_cap_heap_(&cap);
    for (unsigned i = 0; i < per_producer; i++) {
        size_t sz = pick_size(&seed);
        unsigned char *p = nvh_cap_alloc_(h, sz);
        CHECK(p != NULL);
        stamp(p, sz);
        if (cap_rnd(&seed) % 4 == 0) {      /* a few stay local: mixed owners */
            check(p);
            CHECK(nvh_cap_free_(&cap, p) == CAP_OK);
            continue;
        }
        put(p);
    }
    pthread_mutex_lock(&qlock);
    producers_left--;
    pthread_cond_broadcast(&qnot_empty);
    pthread_mutex_unlock(&qlock);
    return NULL;   /* exits: its heap becomes an orphan others free into */
}

static void *consumer(void *arg)
{
    uintptr_t id = (uintptr_t)arg;
    uint64_t seed = id * 0x9E3779B97F4A7C15ull + 3;
    /* consumer 0 never allocates: it has no heap of its own */
    struct cap_heap *h = id ? nvh_cap_heap_(&cap) : NULL;
    void *p;
    while ((p = get()) != NULL) {
        check(p);
        if (h && cap_rnd(&seed) % 8 == 0) {
            /* grow it (a block of another thread's heap) by realloc */
            size_t old = ((struct hdr *)p)->size;
            size_t sz = old + old / 2 + 1;
            int bad;
            unsigned char *r = nvh_cap_realloc_(h, p, sz, &bad);
            CHECK(bad == CAP_OK && r != NULL);
            CHECK(((struct hdr *)r)->size == old && r[old - 1] == (unsigned char)old);
            stamp(r, sz);
            check(r);
            p = r;
        }
        CHECK(nvh_cap_free_(&cap, p) == CAP_OK);
    }
    return NULL;
}

static void test_xthread(void **state)
{
    (void)state;
    const char *qk = getenv("NVHEAP_TEST_QUICK");
    if (qk && *qk == '1')
        per_producer /= 4;
    assert_int_equal(nvh_cap_init_file_(&cap, "/dev/shm", (size_t)64 << 30), 0);
    pthread_t pt[PRODUCERS], ct[CONSUMERS];
    for (uintptr_t i = 0; i < CONSUMERS; i++)
        pthread_create(&ct[i], NULL, consumer, (void *)i);
    for (uintptr_t i = 0; i < PRODUCERS; i++)
        pthread_create(&pt[i], NULL, producer, (void *)(i + 1));
    for (unsigned i = 0; i < PRODUCERS; i++)
        pthread_join(pt[i], NULL);
    for (unsigned i = 0; i < CONSUMERS; i++)
        pthread_join(ct[i], NULL);
    /* every block was freed and every thread exited: nothing is in use but
     * the pages of the orphaned heaps' caches, and trimming gives the file
     * back */
    nvh_cap_trim_(&cap);
    struct nvh_cap_counters c;
    nvh_cap_counters_(&cap, &c);
    assert_true(c.span_bytes <= (size_t)(PRODUCERS + CONSUMERS) * NVH_CAP_EMPTY_PAGES * NVH_CAP_SMALL_PAGE);
    assert_true(c.file_bytes < c.span_peak / 10 + ((size_t)4 << 20));
    nvh_cap_destroy_(&cap);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_xthread)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
