/* test_cap_unit.c — the capacity allocator's core (src/cap/heap.c, span.c)
 * on a file instance: every size class, alignment, usable sizes, realloc,
 * calloc, bad-pointer detection, cross-thread frees, orphaned heaps, and
 * the file giving its space back after frees. */
#include "cap_unit.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

static void test_sizes(void **state)
{
    (void)state;
    struct cap_heap *h = heap();
    static void *ptr[4096];
    size_t n = 0;
    for (size_t sz = 0; sz <= ((size_t)2 << 20); sz = sz < 64 ? sz + 1 : sz + sz / 7 + 1) {
        void *p = nvh_cap_alloc_(h, sz);
        assert_non_null(p);
        assert_true(nvh_cap_contains_(&cap, p));
        assert_int_equal((uintptr_t)p % 16, 0);
        size_t u = nvh_cap_usable_(&cap, p);
        assert_true(u >= sz);
        assert_true(u <= (sz < 64 ? 64 : sz + sz / 4 + 4096));
        memset(p, (int)(sz & 0xff), sz);
        ptr[n++] = p;
    }
    for (size_t i = 0; i < n; i++)
        assert_int_equal(nvh_cap_free_(&cap, ptr[i]), CAP_OK);
}

/* Every size gets the smallest class that holds it: 16 B steps up to 64,
 * then four classes per power of two (no class more than a quarter too big). */
static void test_class_tight(void **state)
{
    (void)state;
    /* a fresh heap: no bigger class has free blocks to lend (test_borrow) */
    static struct cap_inst c1;
    assert_int_equal(nvh_cap_init_file_(&c1, "/dev/shm", (size_t)1 << 30), 0);
    struct cap_heap *h = nvh_cap_heap_(&c1);
    assert_non_null(h);
    for (size_t sz = 1; sz <= NVH_CAP_CLASS_MAX; sz++) {
        void *p = nvh_cap_alloc_(h, sz);
        assert_non_null(p);
        size_t u = nvh_cap_usable_(&c1, p);
        assert_true(u >= sz);
        assert_true(sz <= 64 ? u < sz + 16 : u <= sz + sz / 4);
        if (sz <= 1024) {
            /* exactly the coarse class: 16 B steps to 64, then 4 per power
             * of two (heap.c's table of these sizes) */
            size_t w = sz ? sz - 1 : 0;
            unsigned lg = 63u - (unsigned)__builtin_clzll(w | 1);
            size_t step = sz <= 64 ? 16 : (size_t)1 << (lg - 2);
            assert_int_equal(u, (w | (step - 1)) + 1);
        }
        assert_int_equal(nvh_cap_free_(&c1, p), CAP_OK);
    }
    nvh_cap_destroy_(&c1);
}

/* A heap that holds more than NVH_CAP_FINE_BYTES of pages rounds with the
 * fine classes (2^NVH_CAP_CLASS_SHIFT per power of two), sizes its pages to
 * leave short tails and hands the tails out as blocks of smaller classes:
 * once the heap is big (twice NVH_CAP_FINE_BYTES asked for), 64 MiB more of
 * blocks of sizes uniform in 10 B .. 4 KiB ([Moraru11] Table 2) take pages
 * within 1.45 % of the bytes asked for (1.40 %; 1.05 % without the small
 * heap's borrowing in the first 4 MiB, or with NVH_CAP_BORROW_UP 3, which
 * shift where the classes' current pages stand when the measured part
 * starts; 1.48 % with the tails left unused; the coarse classes alone: over
 * 9 %). A small heap keeps the coarse classes. */
static size_t fine_usable_small, fine_usable_big;
static double fine_ratio;

static void *fine_thread(void *arg)
{
    (void)arg;
    struct cap_heap *h = heap();
    size_t n = 0, want = 0, cap_n = 200000;
    void **ptr = malloc(cap_n * sizeof *ptr);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    /* a small heap: a 2100 B block gets the coarse class, 2560 B */
    void *q = nvh_cap_alloc_(h, 2100);
    fine_usable_small = nvh_cap_usable_(&cap, q);
    assert_int_equal(nvh_cap_free_(&cap, q), CAP_OK);
    struct nvh_cap_counters a, b;
    for (int phase = 0; phase < 2; phase++) {
        /* phase 0 makes the heap big; phase 1 is measured */
        nvh_cap_counters_(&cap, &a);
        want = 0;
        while (want < (phase ? (size_t)64 << 20 : 2 * NVH_CAP_FINE_BYTES)) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t sz = 10 + (size_t)(x % 4087);
            ptr[n] = nvh_cap_alloc_(h, sz);
            assert_non_null(ptr[n]);
            want += sz;
            n++;
            assert_true(n < cap_n);
        }
    }
    nvh_cap_counters_(&cap, &b);
    fine_ratio = (double)(b.span_bytes - a.span_bytes) / (double)want;
    q = nvh_cap_alloc_(h, 2100);   /* now the fine class: 2112 B */
    fine_usable_big = nvh_cap_usable_(&cap, q);
    assert_int_equal(nvh_cap_free_(&cap, q), CAP_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(nvh_cap_free_(&cap, ptr[i]), CAP_OK);
    free(ptr);
    return NULL;
}

static void test_fine_classes(void **state)
{
    (void)state;
    pthread_t t;   /* a fresh heap */
    pthread_create(&t, NULL, fine_thread, NULL);
    pthread_join(t, NULL);
    assert_int_equal(fine_usable_small, 2560);
    fprintf(stderr, "  fine classes: pages %.2f %% over the bytes asked for\n", 100.0 * (fine_ratio - 1));
    assert_true(fine_ratio < 1.0145);
    assert_int_equal(fine_usable_big, 2112);
}

static void test_aligned(void **state)
{
    (void)state;
    struct cap_heap *h = heap();
    for (size_t a = 32; a <= ((size_t)1 << 21); a <<= 1) {
        size_t sizes[] = {1, a / 2, a, 3 * a + 5, 100000};
        for (unsigned i = 0; i < 5; i++) {
            void *p = nvh_cap_alloc_aligned_(h, sizes[i], a);
            assert_non_null(p);
            assert_int_equal((uintptr_t)p % a, 0);
            assert_true(nvh_cap_usable_(&cap, p) >= sizes[i]);
            memset(p, 1, sizes[i]);
            assert_int_equal(nvh_cap_free_(&cap, p), CAP_OK);
        }
    }
}

static void test_calloc_realloc(void **state)
{
    (void)state;
    struct cap_heap *h = heap();
    for (size_t sz = 1; sz < ((size_t)4 << 20); sz = sz * 3 + 1) {
        unsigned char *p = nvh_cap_alloc_(h, sz);
        memset(p, 0xAB, sz);
        assert_int_equal(nvh_cap_free_(&cap, p), CAP_OK);
        p = nvh_cap_calloc_(h, sz);
        for (size_t i = 0; i < sz; i += 97)
            assert_int_equal(p[i], 0);
        assert_int_equal(p[sz - 1], 0);
        assert_int_equal(nvh_cap_free_(&cap, p), CAP_OK);
    }
    /* realloc growth keeps the bytes, in place or moved */
    unsigned char *p = NULL;
    size_t have = 0;
    for (size_t sz = 1; sz <= ((size_t)3 << 20); sz += sz / 3 + 7) {
        int bad = 0;
        unsigned char *q = p ? nvh_cap_realloc_(h, p, sz, &bad) : nvh_cap_alloc_(h, sz);
        assert_int_equal(bad, CAP_OK);
        assert_non_null(q);
        for (size_t i = 0; i < have; i++)
            assert_int_equal(q[i], (unsigned char)(i * 7));
        for (size_t i = have; i < sz; i++)
            q[i] = (unsigned char)(i * 7);
        p = q;
        have = sz;
    }
    /* and shrinking */
    int bad = 0;
    p = nvh_cap_realloc_(h, p, 100, &bad);
    for (size_t i = 0; i < 100; i++)
        assert_int_equal(p[i], (unsigned char)(i * 7));
    assert_int_equal(nvh_cap_free_(&cap, p), CAP_OK);
}

/* A buffer grown by realloc in small steps keeps headroom (half in a size
 * class, doubling in a span of its own), so it moves (is copied) and takes
 * the span lock a logarithmic number of times, not at every class step;
 * its content survives every step. */
static void test_realloc_growth_moves(void **state)
{
    (void)state;
    struct cap_heap *h = heap();
    size_t sz = 16;
    unsigned char *p = nvh_cap_alloc_(h, sz);
    assert_non_null(p);
    memset(p, 0x5A, sz);
    unsigned moves = 0, steps = 0;
    while (sz < ((size_t)1 << 20)) {
        size_t nsz = sz + sz / 8;
        int bad;
        unsigned char *q = nvh_cap_realloc_(h, p, nsz, &bad);
        assert_int_equal(bad, CAP_OK);
        assert_non_null(q);
        assert_true(q[0] == 0x5A && q[sz - 1] == 0x5A);
        memset(q + sz, 0x5A, nsz - sz);
        moves += q != p;
        steps++;
        p = q;
        sz = nsz;
    }
    /* 16 B .. 1 MiB in steps of 1/8: 96 steps, 11 moves (without headroom
     * in the size classes: 28) */
    assert_true(steps > 90);
    assert_true(moves <= 16);
    /* a roomy block stays where it is while it shrinks a little */
    int bad;
    assert_ptr_equal(nvh_cap_realloc_(h, p, sz / 3, &bad), p);
    assert_int_equal(nvh_cap_free_(&cap, p), CAP_OK);
    assert_int_equal(nvh_cap_free_(&cap, p), CAP_DOUBLE);   /* kept, still free */
    /* the thread keeps the grown block: the next buffer that grows past a
     * page takes it whole, and grows to 1 MiB without one call of the span
     * allocator (each under its lock) */
    unsigned char *first = p;
    uint64_t calls0 = 0;
    sz = 16;
    p = nvh_cap_alloc_(h, sz);
    memset(p, 0x33, sz);
    while (sz < ((size_t)1 << 20)) {
        size_t nsz = sz + sz / 8;
        unsigned char *q = nvh_cap_realloc_(h, p, nsz, &bad);
        assert_non_null(q);
        assert_true(q[0] == 0x33 && q[sz - 1] == 0x33);
        memset(q + sz, 0x33, nsz - sz);
        if (q == first && p != first)
            calls0 = cap.span_calls;   /* it moved into the kept block */
        p = q;
        sz = nsz;
    }
    assert_ptr_equal(p, first);
    assert_int_equal(cap.span_calls, calls0);
    assert_int_equal(nvh_cap_free_(&cap, p), CAP_OK);
    assert_non_null(heap()->rkeep);
    nvh_cap_trim_(&cap);   /* gives it back */
    assert_null(heap()->rkeep);
}

/* Large blocks are rounded to large classes: a freed block serves a
 * slightly bigger request of its class, at the same address (pages mapped). */
static void test_large_class_reuse(void **state)
{
    (void)state;
    struct cap_heap *h = heap();
    unsigned char *a = nvh_cap_alloc_(h, (size_t)100 << 10);
    unsigned char *guard = nvh_cap_alloc_(h, (size_t)100 << 10);   /* a is not at the top */
    assert_non_null(a);
    assert_non_null(guard);
    a[0] = a[(100 << 10) - 1] = 1;
    assert_int_equal(nvh_cap_free_(&cap, a), CAP_OK);
    unsigned char *b = nvh_cap_alloc_(h, (size_t)102 << 10);
    assert_ptr_equal(b, a);
    assert_true(nvh_cap_usable_(&cap, b) >= ((size_t)102 << 10));
    /* 12.5 % rounding at most, and a cached block serves requests up to a
     * quarter smaller */
    assert_true(nvh_cap_usable_(&cap, b) <= ((size_t)102 << 10) * 3 / 2);
    assert_int_equal(nvh_cap_free_(&cap, b), CAP_OK);
    assert_int_equal(nvh_cap_free_(&cap, guard), CAP_OK);
}

static void test_bad_pointers(void **state)
{
    (void)state;
    struct cap_heap *h = heap();
    char *small = nvh_cap_alloc_(h, 100);
    char *large = nvh_cap_alloc_(h, 300000);
    assert_int_equal(nvh_cap_free_(&cap, small + 8), CAP_INVALID);     /* interior */
    assert_int_equal(nvh_cap_free_(&cap, large + 4096), CAP_INVALID);  /* interior */
    assert_int_equal(nvh_cap_free_(&cap, large + 16), CAP_INVALID);
    assert_int_equal(nvh_cap_usable_(&cap, small + 16), 0);
    /* a block of a page never handed out */
    assert_int_not_equal(nvh_cap_free_(&cap, small + 112 * 300), CAP_OK);
    /* far in the range, never used */
    assert_int_equal(nvh_cap_free_(&cap, (char *)cap.base + cap.size - 4096), CAP_INVALID);
    assert_int_equal(nvh_cap_free_(&cap, small), CAP_OK);
    assert_int_equal(nvh_cap_free_(&cap, small), CAP_DOUBLE);
    assert_int_equal(nvh_cap_free_(&cap, large), CAP_OK);
    assert_int_equal(nvh_cap_free_(&cap, large), CAP_DOUBLE);
    int bad = 0;
    assert_null(nvh_cap_realloc_(h, small, 10, &bad));
    assert_int_equal(bad, CAP_DOUBLE);
    /* a big one goes to the global pool: freeing it twice is still caught */
    char *huge = nvh_cap_alloc_(h, (size_t)16 << 20);
    assert_int_equal(nvh_cap_free_(&cap, huge), CAP_OK);
    assert_int_equal(nvh_cap_free_(&cap, huge), CAP_DOUBLE);
    /* the heap still works */
    void *p = nvh_cap_alloc_(h, 100);
    assert_int_equal(nvh_cap_free_(&cap, p), CAP_OK);
}

/* ---- cross-thread frees and orphans ---------------------------------------- */
#define XN 20000
static void *xptr[XN];

static void *producer(void *arg)
{
    (void)arg;
    struct cap_heap *h = nvh_cap_heap_(&cap);
    for (unsigned i = 0; i < XN; i++) {
        size_t sz = 16 + (i * 37) % 3000;
        xptr[i] = nvh_cap_alloc_(h, sz);
        memset(xptr[i], (int)i, sz);
    }
    return NULL;   /* exits: its heap becomes an orphan with live pages */
}

static void test_cross_thread_and_orphans(void **state)
{
    (void)state;
    struct nvh_cap_counters before, mid, after;
    nvh_cap_trim_(&cap);
    nvh_cap_counters_(&cap, &before);
    pthread_t t;
    pthread_create(&t, NULL, producer, NULL);
    pthread_join(t, NULL);
    nvh_cap_counters_(&cap, &mid);
    assert_true(mid.span_bytes > before.span_bytes);
    for (unsigned i = 0; i < XN; i++) {
        assert_int_equal(*(unsigned char *)xptr[i], (unsigned char)i);
        assert_int_equal(nvh_cap_free_(&cap, xptr[i]), CAP_OK);
    }
    nvh_cap_trim_(&cap);
    nvh_cap_counters_(&cap, &after);
    /* frees into an orphan's pages are drained at once: its pages went back */
    assert_true(after.span_bytes <= before.span_bytes + NVH_CAP_SMALL_PAGE);
    /* a new thread adopts the orphan heap */
    pthread_create(&t, NULL, producer, NULL);
    pthread_join(t, NULL);
    for (unsigned i = 0; i < XN; i++)
        assert_int_equal(nvh_cap_free_(&cap, xptr[i]), CAP_OK);
}

/* A cross-thread free queues the address and leaves the block alone (its
 * line stays in the owner's cache); the owner checks and keys it when it
 * drains. A second cross-thread free of the block before that is found
 * there: counted, reported, and the block is not freed twice. With
 * key_at_free (the pool part) the freeing call reports it itself. */
static void *xfree_ptr;
static int xfree_rc[2];

static void *xfree_twice(void *arg)
{
    (void)arg;
    nvh_cap_free_(&cap, nvh_cap_alloc_(heap(), 16));   /* a heap of its own */
    xfree_rc[0] = nvh_cap_free_(&cap, xfree_ptr);
    xfree_rc[1] = nvh_cap_free_(&cap, xfree_ptr);
    return NULL;   /* exits: its batch goes to the owner */
}

static void *xfree_once(void *arg)
{
    (void)arg;
    nvh_cap_free_(&cap, nvh_cap_alloc_(heap(), 16));
    xfree_rc[0] = nvh_cap_free_(&cap, xfree_ptr);
    return NULL;
}

static void test_remote_free_untouched(void **state)
{
    (void)state;
    struct cap_heap *h = heap();
    enum { SZ = 400 };
    unsigned char *p = nvh_cap_alloc_(h, SZ);
    memset(p, 0xAB, SZ);
    xfree_ptr = p;
    uint64_t late0 = atomic_load(&cap.late_doubles);
    pthread_t t;
    pthread_create(&t, NULL, xfree_twice, NULL);
    pthread_join(t, NULL);
    assert_int_equal(xfree_rc[0], CAP_OK);
    assert_int_equal(xfree_rc[1], CAP_OK);   /* not known yet */
    for (unsigned i = 0; i < SZ; i++)
        assert_int_equal(p[i], 0xAB);        /* not read or written */
    nvh_cap_trim_(&cap);                     /* drains */
    assert_int_equal(atomic_load(&cap.late_doubles), late0 + 1);
    /* the block was freed once: of the class's next blocks none repeats */
    enum { N = 2000 };
    static unsigned char *q[N];
    for (unsigned i = 0; i < N; i++) {
        q[i] = nvh_cap_alloc_(h, SZ);
        for (unsigned j = 0; j < i; j++)
            assert_ptr_not_equal(q[i], q[j]);
    }
    for (unsigned i = 0; i < N; i++)
        assert_int_equal(nvh_cap_free_(&cap, q[i]), CAP_OK);
    /* the pool part's mode: the freeing call sees the double free */
    cap.key_at_free = true;
    p = nvh_cap_alloc_(h, SZ);
    xfree_ptr = p;
    pthread_create(&t, NULL, xfree_twice, NULL);
    pthread_join(t, NULL);
    assert_int_equal(xfree_rc[0], CAP_OK);
    assert_int_equal(xfree_rc[1], CAP_DOUBLE);
    nvh_cap_trim_(&cap);
    assert_int_equal(atomic_load(&cap.late_doubles), late0 + 1);
    cap.key_at_free = false;
    /* a single cross-thread free, then the owner's own free of it: the
     * drain finds it */
    p = nvh_cap_alloc_(h, SZ);
    xfree_ptr = p;
    pthread_create(&t, NULL, xfree_once, NULL);
    pthread_join(t, NULL);
    assert_int_equal(xfree_rc[0], CAP_OK);
    assert_int_equal(nvh_cap_free_(&cap, p), CAP_OK);
    nvh_cap_trim_(&cap);
    assert_int_equal(atomic_load(&cap.late_doubles), late0 + 2);
}

/* ---- file space --------------------------------------------------------------- */
static void *exit_thread(void *arg)
{
    (void)arg;
    nvh_cap_free_(&cap, nvh_cap_alloc_(heap(), 100));
    return NULL;
}

static void test_file_shrinks(void **state)
{
    (void)state;
    struct cap_heap *h = heap();
    enum { N = 600 };
    static void *p[N];
    struct nvh_cap_counters c0, peak, end;
    nvh_cap_trim_(&cap);
    nvh_cap_counters_(&cap, &c0);
    size_t live = 0;
    for (unsigned i = 0; i < N; i++) {
        size_t sz = i % 3 == 0 ? 1000 + i : (size_t)(i % 7 + 1) * 100000;
        p[i] = nvh_cap_alloc_(h, sz);
        memset(p[i], 1, sz);
        live += sz;
    }
    nvh_cap_counters_(&cap, &peak);
    assert_true(peak.file_bytes >= live);
    assert_true(peak.file_bytes - c0.file_bytes <= live + live / 2);
    for (unsigned i = 0; i < N; i++)
        assert_int_equal(nvh_cap_free_(&cap, p[i]), CAP_OK);
    /* the recent peak keeps the pages for a window or two; once it has
     * passed, the next free punches all but the floor and the caches */
    usleep(3 * NVH_CAP_DECAY_MS * 1000);
    nvh_cap_free_(&cap, nvh_cap_alloc_(h, (size_t)3 << 20));
    nvh_cap_counters_(&cap, &end);
    assert_true(end.file_bytes - c0.file_bytes < peak.file_bytes / 10 + ((size_t)8 << 20));
    nvh_cap_trim_(&cap);
    nvh_cap_counters_(&cap, &end);
    assert_true(end.file_bytes <= c0.file_bytes + ((size_t)2 << 20));
    assert_true(end.punches > 0);
}

static uint64_t minor_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return (uint64_t)ru.ru_minflt;
}

/* Freed large blocks are kept whole, mapped and resident: blocks of the
 * same sizes allocated again land on them, and a program that writes their
 * first and last bytes takes no page fault (carved out of coalesced free
 * space at new offsets, or punched, most would fault). */
static void test_large_kept_resident(void **state)
{
    (void)state;
    struct cap_heap *h = heap();
    enum { N = 40 };
    static unsigned char *p[N];
    static size_t sz[N];
    nvh_cap_trim_(&cap);
    for (unsigned i = 0; i < N; i++) {
        sz[i] = (size_t)(i * 37 % 11 + 1) * 90000;
        p[i] = nvh_cap_alloc_(h, sz[i]);
        assert_non_null(p[i]);
        p[i][0] = p[i][sz[i] - 1] = 1;
    }
    void *guard = nvh_cap_alloc_(h, 100000);   /* none of them at the top */
    struct nvh_cap_counters c0, c1;
    for (unsigned i = 0; i < N; i++)
        assert_int_equal(nvh_cap_free_(&cap, p[i]), CAP_OK);
    nvh_cap_counters_(&cap, &c0);
    uint64_t f0 = minor_faults();
    for (unsigned i = N; i-- > 0;) {
        p[i] = nvh_cap_alloc_(h, sz[i]);
        assert_non_null(p[i]);
        p[i][0] = p[i][sz[i] - 1] = 2;
    }
    uint64_t faults = minor_faults() - f0;
    nvh_cap_counters_(&cap, &c1);
    assert_int_equal(c1.punches, c0.punches);
    assert_true(faults <= 2);   /* (a map page at most) */
    for (unsigned i = 0; i < N; i++)
        assert_int_equal(nvh_cap_free_(&cap, p[i]), CAP_OK);
    assert_int_equal(nvh_cap_free_(&cap, guard), CAP_OK);
}

/* A heap that frees everything gives the file back below a tenth of its
 * peak at its first slow path two windows later: free spans, kept large
 * blocks, and the empty current pages of every class (a small heap too:
 * no fixed floor of kept bytes). An instance of its own: the allowance
 * follows the instance's peak. */
static void test_empty_heap_returns_file(void **state)
{
    (void)state;
    static struct cap_inst c2;
    assert_int_equal(nvh_cap_init_file_(&c2, "/dev/shm", (size_t)1 << 30), 0);
    struct cap_heap *h = nvh_cap_heap_(&c2);
    assert_non_null(h);
    enum { NS = 3000, NM = 300, NL = 40 };
    static void *p[NS + NM + NL];
    unsigned n = 0;
    struct nvh_cap_counters peak, end;
    for (unsigned i = 0; i < NS + NM + NL; i++) {
        size_t sz = i < NS ? 16 + i * 7 % 1000 : i < NS + NM ? 1024 + i * 331 % 30000 : 100000 + i * 7919 % 500000;
        p[n] = nvh_cap_alloc_(h, sz);
        assert_non_null(p[n]);
        memset(p[n++], 1, sz);
    }
    nvh_cap_counters_(&c2, &peak);
    assert_true(peak.file_bytes > ((size_t)16 << 20));
    for (unsigned i = 0; i < n; i++)
        assert_int_equal(nvh_cap_free_(&c2, p[i]), CAP_OK);
    usleep(3 * NVH_CAP_DECAY_MS * 1000);
    void *q = nvh_cap_alloc_(h, 200000);      /* a slow path */
    nvh_cap_counters_(&c2, &end);
    assert_true(end.file_bytes < peak.file_bytes / 10);
    assert_int_equal(nvh_cap_free_(&c2, q), CAP_OK);
    nvh_cap_destroy_(&c2);
}

/* A class's blocks freed in its other pages are handed out before its
 * current page carves never-used ones (carving touches new pages of the
 * file). A fresh instance, so the pages are exactly these. */
static void test_freed_before_carved(void **state)
{
    (void)state;
    static struct cap_inst c3;
    assert_int_equal(nvh_cap_init_file_(&c3, "/dev/shm", (size_t)1 << 30), 0);
    struct cap_heap *h = nvh_cap_heap_(&c3);
    assert_non_null(h);
    enum { PER_PAGE = NVH_CAP_SMALL_PAGE / 1024, N = PER_PAGE + 4, FREED = 10 };   /* 1 KiB blocks */
    static void *p[N];
    for (unsigned i = 0; i < N; i++)
        assert_non_null(p[i] = nvh_cap_alloc_(h, 1024));
    /* the first page is full; the second has handed out its first 4 KiB */
    struct cap_span *first = nvh_cap_span_of_(&c3, p[0]);
    assert_ptr_equal(nvh_cap_span_of_(&c3, p[PER_PAGE - 1]), first);
    assert_ptr_not_equal(nvh_cap_span_of_(&c3, p[PER_PAGE]), first);
    for (unsigned i = 0; i < FREED; i++)
        assert_int_equal(nvh_cap_free_(&c3, p[3 * i]), CAP_OK);
    for (unsigned i = 0; i < FREED; i++) {
        p[3 * i] = nvh_cap_alloc_(h, 1024);
        assert_ptr_equal(nvh_cap_span_of_(&c3, p[3 * i]), first);
    }
    for (unsigned i = 0; i < N; i++)
        assert_int_equal(nvh_cap_free_(&c3, p[i]), CAP_OK);
    nvh_cap_destroy_(&c3);
}

/* A page's tail (after its last whole block) is handed out as a block of a
 * smaller class before that class carves never-used blocks, once the page's
 * last block is carved: 3072 B blocks fill a small page but for a tail (1 or
 * 2 KiB), which is the next block of that size. Its frees (the owner's, a
 * double free, another thread's), usable size and realloc work as any
 * block's, and its page stays a page while it lives. */
static struct cap_inst c4;
static void *tail_xfree_ptr;
static int tail_xfree_rc;
static void *tail_xfree(void *arg)
{
    (void)arg;
    tail_xfree_rc = nvh_cap_free_(&c4, tail_xfree_ptr);
    nvh_cap_free_(&c4, nvh_cap_alloc_(nvh_cap_heap_(&c4), 64));   /* a heap here, so the free is batched */
    return NULL;
}

static void test_tail_blocks(void **state)
{
    (void)state;
    assert_int_equal(nvh_cap_init_file_(&c4, "/dev/shm", (size_t)1 << 30), 0);
    struct cap_heap *h = nvh_cap_heap_(&c4);
    assert_non_null(h);
    enum { BS = 3072, PER_PAGE = NVH_CAP_SMALL_PAGE / BS, TAIL = NVH_CAP_SMALL_PAGE - PER_PAGE * BS };
    _Static_assert(TAIL == 1024 || TAIL == 2048, "a tail that is a coarse class");
    static unsigned char *p[PER_PAGE];
    for (unsigned i = 0; i < PER_PAGE; i++) {
        assert_non_null(p[i] = nvh_cap_alloc_(h, BS - 72));
        assert_int_equal(nvh_cap_usable_(&c4, p[i]), BS);
    }
    struct cap_span *pg = nvh_cap_span_of_(&c4, p[0]);
    assert_ptr_equal((void *)pg->start, p[0]);
    unsigned char *t = nvh_cap_alloc_(h, TAIL - 24);
    assert_ptr_equal(t, p[0] + PER_PAGE * BS);
    assert_ptr_equal(nvh_cap_span_of_(&c4, t), pg);
    assert_int_equal(nvh_cap_usable_(&c4, t), TAIL);
    memset(t, 0x5A, TAIL);
    for (unsigned i = 0; i < PER_PAGE; i++)
        assert_int_equal(p[i][0] | p[i][BS - 73], 0);   /* untouched by the tail */
    /* the owner's free, then a second free */
    assert_int_equal(nvh_cap_free_(&c4, t), CAP_OK);
    assert_int_equal(nvh_cap_free_(&c4, t), CAP_DOUBLE);
    assert_int_equal(nvh_cap_usable_(&c4, t), 0);
    /* handed out again; a free by another thread reaches the owner's drain */
    assert_ptr_equal(nvh_cap_alloc_(h, TAIL - 100), t);
    tail_xfree_ptr = t;
    pthread_t th;
    pthread_create(&th, NULL, tail_xfree, NULL);
    pthread_join(th, NULL);
    assert_int_equal(tail_xfree_rc, CAP_OK);
    nvh_cap_trim_(&c4);                        /* drains */
    assert_ptr_equal(nvh_cap_alloc_(h, TAIL), t);
    /* realloc: within its class in place, beyond it moved with its bytes */
    memset(t, 0x77, TAIL);
    assert_ptr_equal(nvh_cap_realloc_(h, t, TAIL - 14, &(int){0}), t);
    int bad = -1;
    unsigned char *m = nvh_cap_realloc_(h, t, 2 * TAIL, &bad);
    assert_int_equal(bad, CAP_OK);
    assert_non_null(m);
    assert_ptr_not_equal(m, t);
    for (unsigned i = 0; i < TAIL; i++)
        assert_int_equal(m[i], 0x77);
    assert_int_equal(nvh_cap_free_(&c4, m), CAP_OK);
    /* the page outlives its whole blocks while the tail lives */
    t = nvh_cap_alloc_(h, TAIL - 24);
    assert_ptr_equal(t, p[0] + PER_PAGE * BS);
    for (unsigned i = 0; i < PER_PAGE; i++)
        assert_int_equal(nvh_cap_free_(&c4, p[i]), CAP_OK);
    assert_int_equal(pg->kind, CAP_SPAN_PAGE);
    assert_int_equal(pg->used, 1);
    assert_int_equal(nvh_cap_usable_(&c4, t), TAIL);
    assert_int_equal(nvh_cap_free_(&c4, t), CAP_OK);
    assert_int_equal(pg->used, 0);
    nvh_cap_destroy_(&c4);
}

/* Placement for a compact range: a class whose current page runs dry
 * refills the lowest of its pages with free blocks (not the one freed into
 * last), and pages that empty at the top of the range give it back: the top
 * is lowered (what glibc's trim does), and a second free of a block that
 * went there is still a double free. */
static void test_low_pages_first(void **state)
{
    (void)state;
    static struct cap_inst c5;
    assert_int_equal(nvh_cap_init_file_(&c5, "/dev/shm", (size_t)1 << 30), 0);
    struct cap_heap *h = nvh_cap_heap_(&c5);
    assert_non_null(h);
    enum { PER = NVH_CAP_SMALL_PAGE / 1024, N = 3 * PER };   /* three pages of 1 KiB blocks */
    static void *p[N];
    for (unsigned i = 0; i < N; i++)
        assert_non_null(p[i] = nvh_cap_alloc_(h, 1024));
    struct cap_span *pg0 = nvh_cap_span_of_(&c5, p[0]), *pg1 = nvh_cap_span_of_(&c5, p[PER]);
    assert_true(pg0->start < pg1->start);
    assert_int_equal(nvh_cap_free_(&c5, p[3]), CAP_OK);         /* page 0 */
    assert_int_equal(nvh_cap_free_(&c5, p[PER + 3]), CAP_OK);   /* page 1, freed into last */
    void *q = nvh_cap_alloc_(h, 1024);
    assert_ptr_equal(nvh_cap_span_of_(&c5, q), pg0);
    assert_ptr_equal(q, p[3]);
    p[3] = q;
    for (unsigned i = 0; i < N; i++)
        if (i != PER + 3)
            assert_int_equal(nvh_cap_free_(&c5, p[i]), CAP_OK);
    nvh_cap_destroy_(&c5);
}

/* A heap keeps a few empty pages for reuse; when its list is full, it keeps
 * the lowest ones and gives the highest back, so kept pages do not hold up
 * the top of the range. */
static void test_low_empty_pages_kept(void **state)
{
    (void)state;
    static struct cap_inst c7;
    assert_int_equal(nvh_cap_init_file_(&c7, "/dev/shm", (size_t)1 << 30), 0);
    struct cap_heap *h = nvh_cap_heap_(&c7);
    assert_non_null(h);
    enum { PER = NVH_CAP_SMALL_PAGE / 1024, PAGES = NVH_CAP_EMPTY_PAGES + 3, N = PAGES * PER };
    static unsigned char *p[N];
    for (unsigned i = 0; i < N; i++)
        assert_non_null(p[i] = nvh_cap_alloc_(h, 1024));
    struct cap_span *pg[PAGES];
    for (unsigned k = 0; k < PAGES; k++) {
        pg[k] = nvh_cap_span_of_(&c7, p[k * PER]);
        assert_true(k == 0 || pg[k]->start > pg[k - 1]->start);
    }
    /* pages 2 .. PAGES-2 emptied: the heap keeps them all */
    for (unsigned k = 2; k < PAGES - 1; k++)
        for (unsigned i = 0; i < PER; i++)
            assert_int_equal(nvh_cap_free_(&c7, p[k * PER + i]), CAP_OK);
    for (unsigned k = 2; k < PAGES - 1; k++)
        assert_int_equal(pg[k]->kind, CAP_SPAN_PAGE);
    /* page 1 emptied: kept, and the highest kept one given back instead */
    for (unsigned i = 0; i < PER; i++)
        assert_int_equal(nvh_cap_free_(&c7, p[PER + i]), CAP_OK);
    assert_int_equal(pg[1]->kind, CAP_SPAN_PAGE);
    assert_int_equal(nvh_cap_span_of_(&c7, p[(PAGES - 2) * PER])->kind, CAP_SPAN_FREE);
    for (unsigned i = 0; i < PER; i++) {
        assert_int_equal(nvh_cap_free_(&c7, p[i]), CAP_OK);
        assert_int_equal(nvh_cap_free_(&c7, p[(PAGES - 1) * PER + i]), CAP_OK);
    }
    nvh_cap_destroy_(&c7);
}

static void test_top_given_back(void **state)
{
    (void)state;
    static struct cap_inst c6;
    assert_int_equal(nvh_cap_init_file_(&c6, "/dev/shm", (size_t)1 << 30), 0);
    struct cap_heap *h = nvh_cap_heap_(&c6);
    assert_non_null(h);
    enum { PG = 32, A = PG * (NVH_CAP_SMALL_PAGE / 1024), B = PG * (NVH_CAP_SMALL_PAGE / 2048) };
    static unsigned char *a[A], *b[B];
    for (unsigned i = 0; i < A; i++)
        assert_non_null(a[i] = nvh_cap_alloc_(h, 1024));    /* pages 0 .. 31 */
    for (unsigned i = 0; i < B; i++)
        assert_non_null(b[i] = nvh_cap_alloc_(h, 2048));    /* pages 32 .. 63 */
    struct nvh_cap_counters c0, c1;
    nvh_cap_counters_(&c6, &c0);
    assert_true(c0.top >= 2 * PG * NVH_CAP_SMALL_PAGE);
    /* the 2 KiB class's current page becomes its lowest one (page 32) */
    assert_int_equal(nvh_cap_free_(&c6, b[0]), CAP_OK);
    unsigned char *b0 = nvh_cap_alloc_(h, 2048);
    assert_ptr_equal(b0, b[0]);
    /* every other 2 KiB block freed: pages 33 .. 63 empty, a few kept by
     * the heap, the rest coalesce at the top and go back */
    size_t per = NVH_CAP_SMALL_PAGE / 2048;
    for (unsigned i = (unsigned)per; i < B; i++)
        assert_int_equal(nvh_cap_free_(&c6, b[i]), CAP_OK);
    nvh_cap_counters_(&c6, &c1);
    assert_true(c1.top <= (PG + 1 + NVH_CAP_EMPTY_PAGES) * NVH_CAP_SMALL_PAGE);
    assert_true(c1.punches > c0.punches);
    /* a second free of a block given back above the top */
    unsigned char *x = b[B - per];   /* the start of page 63: 4 KiB aligned */
    assert_true((uintptr_t)x % NVH_CAP_BLOCK == 0);
    assert_true((uintptr_t)x - c6.base >= c1.top);
    assert_int_equal(nvh_cap_free_(&c6, x), CAP_DOUBLE);
    assert_int_equal(nvh_cap_free_(&c6, x + 2048), CAP_INVALID);
    /* the range grows again from the lowered top */
    for (unsigned i = (unsigned)per; i < B; i++)
        assert_non_null(b[i] = nvh_cap_alloc_(h, 2048));
    for (unsigned i = 0; i < B; i++)
        assert_int_equal(nvh_cap_free_(&c6, b[i]), CAP_OK);
    for (unsigned i = 0; i < A; i++)
        assert_int_equal(nvh_cap_free_(&c6, a[i]), CAP_OK);
    nvh_cap_destroy_(&c6);
}

/* A batch freed and allocated again within the window refills the pages
 * it had: no punching, no new file space per round. The rounds must fit in
 * one window of NVH_CAP_DECAY_MS (the recent peak is remembered for one or
 * two): an attempt that took longer (the thread descheduled on a loaded
 * machine) proves nothing and is run again, up to ATTEMPTS times; a policy
 * that punches by the bytes in use alone punches dozens of times in every
 * attempt, however fast. */
static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void test_batch_no_punch(void **state)
{
    (void)state;
    struct cap_heap *h = heap();
    enum { N = 64, ROUNDS = 20, ATTEMPTS = 20 };
    static unsigned char *p[N];
    struct nvh_cap_counters c0, c1;
    unsigned attempt = 0;
    uint64_t took = 0;
    for (;; attempt++) {
        nvh_cap_trim_(&cap);
        usleep(3 * NVH_CAP_DECAY_MS * 1000);   /* no recent peak from before */
        uint64_t t0 = mono_ms();
        for (unsigned r = 0; r < ROUNDS; r++) {
            for (unsigned i = 0; i < N; i++) {
                size_t sz = (size_t)(i % 8 + 1) * 200000;
                p[i] = nvh_cap_alloc_(h, sz);
                assert_non_null(p[i]);
                p[i][0] = p[i][sz - 1] = (unsigned char)r;
            }
            if (r == 0)
                nvh_cap_counters_(&cap, &c0);
            for (unsigned i = 0; i < N; i++)
                assert_int_equal(nvh_cap_free_(&cap, p[i]), CAP_OK);
        }
        nvh_cap_counters_(&cap, &c1);
        took = mono_ms() - t0;
        /* (punching by the bytes in use alone: dozens per round) */
        if (c1.punches - c0.punches <= 2) break;
        /* more than two punches: a failure unless the rounds overran */
        if (took + 5 < NVH_CAP_DECAY_MS || attempt + 1 == ATTEMPTS)
            fail_msg("%llu punches in %u rounds that took %llu ms (attempt %u)",
                     (unsigned long long)(c1.punches - c0.punches), (unsigned)ROUNDS,
                     (unsigned long long)took, attempt + 1);
    }
    if (attempt)
        fprintf(stderr, "  batch_no_punch: %u attempts overran the %u ms window\n", attempt,
                NVH_CAP_DECAY_MS);
    /* a thread's exit settles the file at once (no waiting for the window) */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, exit_thread, NULL), 0);
    pthread_join(t, NULL);
    nvh_cap_counters_(&cap, &c1);
    assert_true(c1.punches > c0.punches);
    assert_true(c1.dirty_bytes <= (size_t)8 << 20);
}

static long thread_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return ru.ru_minflt + ru.ru_majflt;
}

/* With populate, a fresh large block and a fresh page are faulted in by
 * the allocation: writing them all takes (almost) no fault. */
static void test_populate(void **state)
{
    (void)state;
    struct cap_heap *h = heap();
    size_t big = (size_t)2 << 20;
    for (int on = 0; on <= 1; on++) {
        nvh_cap_trim_(&cap);   /* the next spans are fresh (top or holes) */
        cap.populate = on;
        unsigned char *p = nvh_cap_alloc_(h, big);
        unsigned char *q = nvh_cap_alloc_(h, 40000);   /* a medium page */
        assert_non_null(p);
        assert_non_null(q);
        long f0 = thread_faults();
        memset(p, 7, big);
        memset(q, 7, 40000);
        long f = thread_faults() - f0;
        if (on)
            assert_true(f <= 4);
        else
            assert_true(f >= (long)(big / 4096) / 2);   /* the contrast holds here */
        assert_int_equal(nvh_cap_free_(&cap, p), CAP_OK);
        assert_int_equal(nvh_cap_free_(&cap, q), CAP_OK);
    }
    cap.populate = false;
}

/* A small heap's class whose blocks are all in use, and that would carve
 * never-used blocks or make a page, takes a free block of the next class
 * up instead (heap.c borrow): with the first 4 KiB of the 160 B class
 * handed out, a 150 B request gets a freed 192 B block. Not an aligned
 * request (its block must have the class's alignment), nor one below 64 B
 * (the next class is too much bigger). */
static void test_borrow(void **state)
{
    (void)state;
    static struct cap_inst c8;
    assert_int_equal(nvh_cap_init_file_(&c8, "/dev/shm", (size_t)1 << 30), 0);
    struct cap_heap *h = nvh_cap_heap_(&c8);
    assert_non_null(h);
    enum { N = 10, N160 = 4096 / 160, N32 = 4096 / 32 };
    static void *p[N], *s[N], *own[N160 + N32], *own2[4096 / 192];
    for (unsigned i = 0; i < N; i++) {   /* their pages first: below the others */
        assert_non_null(p[i] = nvh_cap_alloc_(h, 192));
        assert_non_null(s[i] = nvh_cap_alloc_(h, 48));
    }
    for (unsigned i = 0; i < N160; i++)
        assert_int_equal(nvh_cap_usable_(&c8, own[i] = nvh_cap_alloc_(h, 150)), 160);
    for (unsigned i = 0; i < N32; i++)
        assert_int_equal(nvh_cap_usable_(&c8, own[N160 + i] = nvh_cap_alloc_(h, 20)), 32);
    /* a lender above the borrower's page lends nothing: the 224 B class's
     * page lies above the 192 B one's */
    void *hi = nvh_cap_alloc_(h, 224);
    assert_int_equal(nvh_cap_free_(&c8, nvh_cap_alloc_(h, 224)), CAP_OK);
    for (unsigned i = 0; i < 4096 / 192; i++)   /* past the 192 B class's first 4 KiB */
        assert_int_equal(nvh_cap_usable_(&c8, own2[i] = nvh_cap_alloc_(h, 180)), 192);
    void *n192 = nvh_cap_alloc_(h, 180);
    assert_int_equal(nvh_cap_usable_(&c8, n192), 192);
    struct cap_span *pg = nvh_cap_span_of_(&c8, p[0]);
    for (unsigned i = 0; i < N; i++) {
        assert_int_equal(nvh_cap_free_(&c8, p[i]), CAP_OK);
        assert_int_equal(nvh_cap_free_(&c8, s[i]), CAP_OK);
    }
    void *q = nvh_cap_alloc_(h, 150);
    assert_ptr_equal(nvh_cap_span_of_(&c8, q), pg);
    assert_int_equal(nvh_cap_usable_(&c8, q), 192);
    void *a = nvh_cap_alloc_aligned_(h, 150, 32);
    assert_int_equal((uintptr_t)a % 32, 0);
    assert_int_equal(nvh_cap_usable_(&c8, a), 160);
    void *t = nvh_cap_alloc_(h, 20);   /* class 32: not from the freed 48 B */
    assert_int_equal(nvh_cap_usable_(&c8, t), 32);
    assert_int_equal(nvh_cap_free_(&c8, q), CAP_OK);
    assert_int_equal(nvh_cap_free_(&c8, q), CAP_DOUBLE);
    assert_int_equal(nvh_cap_free_(&c8, a), CAP_OK);
    assert_int_equal(nvh_cap_free_(&c8, t), CAP_OK);
    for (unsigned i = 0; i < N160 + N32; i++)
        assert_int_equal(nvh_cap_free_(&c8, own[i]), CAP_OK);
    for (unsigned i = 0; i < 4096 / 192; i++)
        assert_int_equal(nvh_cap_free_(&c8, own2[i]), CAP_OK);
    assert_int_equal(nvh_cap_free_(&c8, n192), CAP_OK);
    assert_int_equal(nvh_cap_free_(&c8, hi), CAP_OK);
    nvh_cap_destroy_(&c8);
}

/* A heap keeps a few empty pages, but a small heap's are punched as they
 * are kept (beyond 1/NVH_CAP_EMPTY_SHARE of its pages, heap.c empty_keep):
 * their file space goes back, and a class reuses the page. A big heap's
 * kept pages stay in the file. */
static void test_empty_pages_punched(void **state)
{
    (void)state;
    static struct cap_inst c9;
    assert_int_equal(nvh_cap_init_file_(&c9, "/dev/shm", (size_t)1 << 30), 0);
    struct cap_heap *h = nvh_cap_heap_(&c9);
    assert_non_null(h);
    enum { PER = NVH_CAP_SMALL_PAGE / 1024, SMALL = 3, BIG = 2 * NVH_CAP_EMPTY_SHARE + 4 };
    static unsigned char *p[BIG * PER];
    struct nvh_cap_counters c0, c1;
    for (unsigned i = 0; i < SMALL * PER; i++) {
        assert_non_null(p[i] = nvh_cap_alloc_(h, 1024));
        memset(p[i], 1, 1024);
    }
    struct cap_span *pg1 = nvh_cap_span_of_(&c9, p[PER]);
    nvh_cap_counters_(&c9, &c0);
    for (unsigned i = PER; i < 2 * PER; i++)   /* page 1 empties: kept */
        assert_int_equal(nvh_cap_free_(&c9, p[i]), CAP_OK);
    nvh_cap_counters_(&c9, &c1);
    assert_int_equal(pg1->kind, CAP_SPAN_PAGE);
    assert_int_equal(c1.punches, c0.punches + 1);
    assert_true(c1.file_bytes + NVH_CAP_SMALL_PAGE <= c0.file_bytes);
    /* the class takes it again (its page faulted in as it is carved) */
    for (unsigned i = PER; i < 2 * PER; i++) {
        assert_non_null(p[i] = nvh_cap_alloc_(h, 1024));
        assert_ptr_equal(nvh_cap_span_of_(&c9, p[i]), pg1);
        memset(p[i], 2, 1024);
    }
    /* a big heap: the same page emptied again is kept with its pages */
    for (unsigned i = SMALL * PER; i < BIG * PER; i++)
        assert_non_null(p[i] = nvh_cap_alloc_(h, 1024));
    nvh_cap_counters_(&c9, &c0);
    for (unsigned i = PER; i < 2 * PER; i++)
        assert_int_equal(nvh_cap_free_(&c9, p[i]), CAP_OK);
    nvh_cap_counters_(&c9, &c1);
    assert_int_equal(pg1->kind, CAP_SPAN_PAGE);
    assert_int_equal(c1.punches, c0.punches);
    assert_int_equal(c1.file_bytes, c0.file_bytes);
    for (unsigned i = 0; i < BIG * PER; i++)
        if (i < PER || i >= 2 * PER)
            assert_int_equal(nvh_cap_free_(&c9, p[i]), CAP_OK);
    nvh_cap_destroy_(&c9);
}

/* The file-space target on bench/run cap's small loop (each thread
 * keeps 2,000 blocks of 16 B .. 1 KiB, log-uniform, and replaces a random
 * one per operation; the bench's sequence of thread `id` for ids 0 .. 11,
 * the bench's two threads and ten more seeds): at the bench's sample,
 * halfway through 1 M operations, the file holds at most 1.5 times the
 * bytes live for the bench's two sequences, and at most 1.55 times for
 * every one of the twelve (1.59 lending only to current pages; 1.51 now,
 * sequence 2; a heap's decay, every 100 ms of wall time, falling inside a
 * slow run moves it by about 0.02: 1.52 under ASan; docs/CAP.md: 1.5 for
 * all of them costs CPU). The classes'
 * high-water marks (borrow) and kept empty pages (empty_keep) put it above
 * that. */
static uint64_t xs_rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_small_loop_file(void **state)
{
    (void)state;
    enum { SLOTS = 2000, OPS = 1000000 };
    static unsigned char *slot[SLOTS];
    static size_t size[SLOTS];
    double worst = 0;
    for (unsigned id = 0; id < 12; id++) {
        static struct cap_inst c10;
        assert_int_equal(nvh_cap_init_file_(&c10, "/dev/shm", (size_t)1 << 30), 0);
        struct cap_heap *h = nvh_cap_heap_(&c10);
        assert_non_null(h);
        uint64_t seed = 0x9E3779B97F4A7C15ull * (id + 1);   /* bench_cap.c, loop 0 */
        size_t held = 0;
        memset(slot, 0, sizeof slot);
        for (unsigned i = 0; i <= OPS / 2; i++) {
            unsigned k = (unsigned)(xs_rnd(&seed) % SLOTS);
            if (slot[k]) {
                assert_int_equal(nvh_cap_free_(&c10, slot[k]), CAP_OK);
                held -= size[k];
            }
            unsigned b = 4 + (unsigned)(xs_rnd(&seed) % 6);
            size_t sz = ((size_t)1 << b) + (size_t)(xs_rnd(&seed) % ((size_t)1 << b));
            assert_non_null(slot[k] = nvh_cap_alloc_(h, sz));
            slot[k][0] = 1;
            slot[k][sz - 1] = 2;
            size[k] = sz;
            held += sz;
        }
        struct nvh_cap_counters c;
        nvh_cap_counters_(&c10, &c);
        fprintf(stderr, "  small loop, thread %u: file %zu KiB, live %zu KiB (%.2fx)\n", id,
                c.file_bytes >> 10, held >> 10, (double)c.file_bytes / (double)held);
        if (id < 2)
            assert_true(c.file_bytes * 2 <= held * 3);
        if ((double)c.file_bytes / (double)held > worst)
            worst = (double)c.file_bytes / (double)held;
        for (unsigned k = 0; k < SLOTS; k++)
            assert_int_equal(nvh_cap_free_(&c10, slot[k]), CAP_OK);
        nvh_cap_destroy_(&c10);
    }
    fprintf(stderr, "  small loop: worst %.2fx\n", worst);
    assert_true(worst <= 1.55);
}

/* A page's tail is offered as a block of a class whose alignment the tail's
 * address has, counting only alignments up to 4 KiB (every page starts on
 * one; aligned requests above 4 KiB never take class blocks): alignments
 * above that would depend on where the system placed the range, and so
 * would which blocks pin which pages (the medium loop's file ranged over
 * 0.9 - 1.33 x live with the same sequence). A region at a 2 MiB boundary:
 * the first page of class 40960 (12 blocks in 512 KiB) ends in a 32 KiB
 * tail at a 32 KiB boundary; it is offered as a 28672 B block (7 x 4 KiB),
 * the same as on any other base. */
static void test_tail_class_base(void **state)
{
    (void)state;
    static struct cap_inst c11;
    size_t sz = (size_t)64 << 20, al = (size_t)2 << 20;
    char *raw = mmap(NULL, sz + al, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(raw != MAP_FAILED);
    char *base = (char *)(((uintptr_t)raw + al - 1) & ~(uintptr_t)(al - 1));
    assert_int_equal(nvh_cap_init_region_(&c11, base, sz), 0);
    struct cap_heap *h = nvh_cap_heap_(&c11);
    assert_non_null(h);
    void *p[12];
    for (unsigned i = 0; i < 12; i++)
        assert_non_null(p[i] = nvh_cap_alloc_(h, 40000));
    struct cap_span *s = nvh_cap_span_of_(&c11, p[0]);
    assert_ptr_equal(nvh_cap_span_of_(&c11, p[11]), s);
    assert_int_equal(s->end % 32768, 0);
    void *t = nvh_cap_alloc_(h, 28000);
    assert_ptr_equal(t, (void *)s->end);
    assert_int_equal(nvh_cap_usable_(&c11, t), 28672);
    assert_int_equal(nvh_cap_free_(&c11, t), CAP_OK);
    for (unsigned i = 0; i < 12; i++)
        assert_int_equal(nvh_cap_free_(&c11, p[i]), CAP_OK);
    nvh_cap_destroy_(&c11);
    munmap(raw, sz + al);
}

/* A thread that frees into other heaps takes its batches of cross-thread
 * frees from the instance NVH_CAP_RSPARE / 2 + 1 at a time (one lock), not
 * one per lock (heap.c rbatch_get): after its first cross-thread free it
 * holds the spares, and 32 full batches later it has not asked again. */
static struct cap_inst c12;
static void *rbatch_thread(void *arg)
{
    void **blk = arg;
    struct cap_heap *h = nvh_cap_heap_(&c12);
    assert_non_null(h);
    assert_int_equal(h->nspare, 0);
    assert_int_equal(nvh_cap_free_(&c12, blk[0]), CAP_OK);
    assert_int_equal(h->nspare, NVH_CAP_RSPARE / 2);
    for (unsigned i = 1; i < 33 * NVH_CAP_RBATCH; i++)
        assert_int_equal(nvh_cap_free_(&c12, blk[i]), CAP_OK);
    assert_int_equal(h->nspare, 0);
    return NULL;
}

static void test_rbatch_bulk(void **state)
{
    (void)state;
    assert_int_equal(nvh_cap_init_file_(&c12, "/dev/shm", (size_t)1 << 30), 0);
    struct cap_heap *h = nvh_cap_heap_(&c12);
    assert_non_null(h);
    enum { N = 33 * NVH_CAP_RBATCH };
    static void *blk[N];
    for (unsigned i = 0; i < N; i++)
        assert_non_null(blk[i] = nvh_cap_alloc_(h, 64));
    pthread_t t;
    pthread_create(&t, NULL, rbatch_thread, blk);
    pthread_join(t, NULL);
    void *q = nvh_cap_alloc_(h, 64);   /* a slow path drains the frees */
    assert_non_null(q);
    assert_int_equal(nvh_cap_free_(&c12, q), CAP_OK);
    nvh_cap_destroy_(&c12);
}

/* a descriptor per instance, close-on-exec, and no name in the directory */
static void test_file_is_anonymous(void **state)
{
    (void)state;
    int flags = fcntl(cap.fd, F_GETFD);
    assert_true(flags & FD_CLOEXEC);
    struct stat st;
    assert_int_equal(fstat(cap.fd, &st), 0);
    assert_int_equal(st.st_nlink, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_class_tight),
        cmocka_unit_test(test_fine_classes),
        cmocka_unit_test(test_aligned),
        cmocka_unit_test(test_calloc_realloc),
        cmocka_unit_test(test_realloc_growth_moves),
        cmocka_unit_test(test_large_class_reuse),
        cmocka_unit_test(test_bad_pointers),
        cmocka_unit_test(test_cross_thread_and_orphans),
        cmocka_unit_test(test_remote_free_untouched),
        cmocka_unit_test(test_file_shrinks),
        cmocka_unit_test(test_batch_no_punch),
        cmocka_unit_test(test_large_kept_resident),
        cmocka_unit_test(test_empty_heap_returns_file),
        cmocka_unit_test(test_freed_before_carved),
        cmocka_unit_test(test_tail_blocks),
        cmocka_unit_test(test_low_pages_first),
        cmocka_unit_test(test_low_empty_pages_kept),
        cmocka_unit_test(test_top_given_back),
        cmocka_unit_test(test_borrow),
        cmocka_unit_test(test_empty_pages_punched),
        cmocka_unit_test(test_small_loop_file),
        cmocka_unit_test(test_tail_class_base),
        cmocka_unit_test(test_rbatch_bulk),
        cmocka_unit_test(test_populate),
        cmocka_unit_test(test_file_is_anonymous),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
