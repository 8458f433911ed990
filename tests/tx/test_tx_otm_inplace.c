/* test_tx_otm_inplace.c — object reads in place (nvh_tx_open_read hands out
 * the object itself; validated at an open of a newer object and at commit,
 * src/tx/otm.c):
 *   - costs: no copy (the pointer is the object), a read-only transaction
 *     takes no fence and flushes nothing; read-after-write still sees the
 *     private copy; nvh_tx_open_read_copy copies;
 *   - a writer commits between two reads of one transaction, at a chosen
 *     point (between two opens; after the last open, before commit): the
 *     committed read-only transaction saw the state before or after the
 *     writer, never a mix; the negative control with validation disabled
 *     commits a mix;
 *   - a doomed reader follows a pointer that a concurrent commit changed to
 *     one outside the pool, or returns an error it derived from a torn
 *     view: nvh_tx_run retries it as a conflict, it is not the caller's
 *     error;
 *   - unrecorded reads (the clock sampled with no commit in flight): the
 *     handshake tests run both ways; a reader whose first open finds a
 *     two-fence commit half applied reads recorded and does not commit the
 *     half (negative control: the in-flight count ignored); a commit that
 *     fails after applying in place releases its records with its write
 *     version, so a reader that saw the transient bytes retries, recorded
 *     or not (negative control: released with the old words);
 *   - nvh_tx_run ends a transaction that only read without the full commit:
 *     one that also wrote a word, a range or an allocation is committed
 *     (durable after a reopen);
 *   - the open bound to nvh_tx_run's thread refuses every pointer the full
 *     checks refuse, with their errors, and opens memory the pool grew into
 *     after the binding;
 *   - space freed while a reader is in is not reused under it (epochs);
 *   - nvh_tx_run_read (address-free reads, the clock word the only check):
 *     the handshake tests again, an error and a pointer from a changed
 *     object retried, a word written by a read run validated at its commit
 *     (its read set is empty), the negative controls commit a mix;
 *   - stress for TSan: writers move amounts between objects whose 8 words
 *     all hold the balance, readers sum every object in place with atomic
 *     loads: every committed read-only transaction saw whole objects whose
 *     sum is the total (model check).
 * Reads of concurrently written words use __atomic_load_n (relaxed): they
 * are data races in C11 terms otherwise (include/nvheap.h, §9). */
#include "test_util.h"

#include "tx/tx.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdbool.h>

#define LAYOUT "txinplace"
#define MIB ((uint64_t)1 << 20)
#define NOBJ 16
#define INIT 1000u

typedef struct obj { uint64_t w[8]; } obj;       /* every word: the balance */
typedef struct bank { obj o[NOBJ]; uint64_t link; uint64_t pad[7]; } bank;

static uint64_t ld(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

/* The balance of an object read in place, or UINT64_MAX if its words differ
 * (a torn read). */
static uint64_t balance(const obj *o)
{
    uint64_t v = ld(&o->w[0]);
    for (unsigned i = 1; i < 8; i++)
        if (ld(&o->w[i]) != v) return UINT64_MAX;
    return v;
}

static bank *bank_setup(nvh_pool *pool)
{
    nvh_off_t *root = nvh_root(pool, NULL);
    bank *b = nvh_alloc(pool, sizeof *b, NULL, NULL, &root[0]);
    assert_non_null(b);
    for (unsigned i = 0; i < NOBJ; i++)
        for (unsigned k = 0; k < 8; k++) b->o[i].w[k] = INIT;
    nvh_persist(pool, b, sizeof *b);
    return b;
}

typedef struct xfer { bank *b; unsigned from, to; uint64_t amount; } xfer;
static int transfer(nvh_pool *pool, void *arg)
{
    xfer *x = arg;
    obj *f = nvh_tx_open_write(pool, &x->b->o[x->from], sizeof(obj));
    obj *t = f ? nvh_tx_open_write(pool, &x->b->o[x->to], sizeof(obj)) : NULL;
    if (!t) return nvh_errcode();
    uint64_t a = x->amount <= f->w[0] ? x->amount : f->w[0];
    for (unsigned k = 0; k < 8; k++) { f->w[k] -= a; t->w[k] += a; }
    return NVH_OK;
}

/* ---------------------------------------------------------------------------
 * Costs and pointers
 * ------------------------------------------------------------------------- */
static int read_two(nvh_pool *pool, void *arg)
{
    bank *b = arg;
    const obj *a = nvh_tx_open_read(pool, &b->o[0], sizeof(obj));
    const obj *c = a ? nvh_tx_open_read(pool, &b->o[1], sizeof(obj)) : NULL;
    if (!c) return nvh_errcode();
    assert_ptr_equal(a, &b->o[0]);                 /* in place: no copy */
    assert_ptr_equal(c, &b->o[1]);
    return balance(a) + balance(c) == 2 * INIT ? NVH_OK : NVH_E_INVAL;
}

static void costs(void **state)
{
    (void)state;
    const char *path = test_path("txinplace");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PMEM);
    assert_non_null(pool);
    bank *b = bank_setup(pool);
    xfer x = {b, 2, 3, 1};
    for (int i = 0; i < 3; i++) assert_int_equal(nvh_tx_run(pool, transfer, &x), NVH_OK);
    nvh_stats_reset(pool);
    for (int i = 0; i < 100; i++) assert_int_equal(nvh_tx_run(pool, read_two, b), NVH_OK);
    nvh_stats s;
    nvh_stats_get(pool, &s);
    assert_int_equal(s.fences, 0);
    assert_int_equal(s.lines_flushed, 0);

    /* read after write: the private copy; the copying read: a copy */
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    const obj *r = nvh_tx_open_read(pool, &b->o[4], sizeof(obj));
    assert_ptr_equal(r, &b->o[4]);
    obj *w = nvh_tx_open_write(pool, &b->o[4], sizeof(obj));
    assert_non_null(w);
    assert_ptr_not_equal(w, &b->o[4]);
    w->w[0] = 7;
    assert_ptr_equal(nvh_tx_open_read(pool, &b->o[4], sizeof(obj)), w);
    const obj *c = nvh_tx_open_read_copy(pool, &b->o[5], sizeof(obj));
    assert_non_null(c);
    assert_ptr_not_equal(c, &b->o[5]);
    assert_int_equal(balance(c), INIT);
    assert_int_equal(nvh_tx_abort(pool), NVH_OK);
    assert_int_equal(b->o[4].w[0], INIT);
    /* the errors are the caller's when nothing changed under it */
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_non_null(nvh_tx_open_read(pool, &b->o[0], sizeof(obj)));
    assert_null(nvh_tx_open_read(pool, NULL, 8));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    assert_null(nvh_tx_open_read(pool, (char *)b + 64 * MIB, 8));
    assert_int_equal(nvh_errcode(), NVH_E_BADPTR);
    assert_int_equal(nvh_tx_commit(pool), NVH_E_ABORTED);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * A writer commits at a chosen point of a reader's transaction
 * ------------------------------------------------------------------------- */
enum { AT_BETWEEN_OPENS, AT_BEFORE_COMMIT, AT_POINTER };
typedef struct hs {
    nvh_pool *pool;
    bank *b;
    int at;
    _Atomic int phase;          /* 0 idle, 1 writer may go, 2 writer done, 3 quit */
    unsigned attempts;
    uint64_t a, c;              /* balances the reader saw */
    bool open_refused;          /* the open after the writer's commit failed */
} hs;

static bool hs_read_run;
/* the reader runs as plain nvh_tx_run after runs that only read (its memory
 * of hs_read picks the address-free first attempt); hs_training: those
 * runs (no writer) */
static bool hs_auto, hs_training;

/* The calling thread's transaction reads address-free (nvh_tx_run_read's
 * first attempt). */
static bool reading_address_free(void)
{
    return nvh_tx_bound_.tx != NULL && nvh_tx_bound_.tx->ro;
}

static void let_writer_commit(hs *h)
{
    if (hs_training) return;
    /* a read run's first attempt is the address-free one */
    if (hs_read_run) assert_int_equal(reading_address_free(), h->attempts == 0);
    if (h->attempts++) return;                     /* once: the first attempt */
    atomic_store(&h->phase, 1);
    while (atomic_load(&h->phase) != 2) sched_yield();
}

static int hs_read(nvh_pool *pool, void *arg)
{
    hs *h = arg;
    bank *b = h->b;
    if (h->at == AT_POINTER) {
        /* the link names the object to read next; the writer points it
         * outside the pool (and moves an amount) after we read it */
        const bank *l = nvh_tx_open_read(pool, b, sizeof *b);
        if (!l) return nvh_errcode();
        h->a = balance(&l->o[0]);
        let_writer_commit(h);
        const obj *c = nvh_tx_open_read(pool, (char *)b + ld(&l->link), sizeof(obj));
        if (!c) return nvh_errcode();
        h->c = balance(c);
        return NVH_OK;
    }
    const obj *a = nvh_tx_open_read(pool, &b->o[0], sizeof(obj));
    if (!a) return nvh_errcode();
    h->a = balance(a);
    if (h->at == AT_BETWEEN_OPENS) let_writer_commit(h);
    const obj *c = nvh_tx_open_read(pool, &b->o[1], sizeof(obj));
    if (!c) {
        h->open_refused = true;
        return nvh_errcode();
    }
    if (h->at == AT_BEFORE_COMMIT) let_writer_commit(h);
    h->c = balance(c);
    return NVH_OK;
}

static int set_link(nvh_pool *pool, void *arg)
{
    bank *b = arg;
    uint64_t *l = nvh_tx_open_write(pool, &b->link, 8);
    if (!l) return nvh_errcode();
    *l = 1ull << 40;                               /* outside any test pool */
    return NVH_OK;
}

static void *hs_writer(void *p)
{
    hs *h = p;
    int ph;
    while ((ph = atomic_load(&h->phase)) != 1 && ph != 3) sched_yield();
    if (ph == 3) return NULL;
    xfer x = {h->b, 0, 1, 100};
    int rc = nvh_tx_run(h->pool, transfer, &x);
    if (rc == NVH_OK && h->at == AT_POINTER) rc = nvh_tx_run(h->pool, set_link, h->b);
    assert_int_equal(rc, NVH_OK);
    atomic_store(&h->phase, 2);
    return NULL;
}

/* The handshake's reader runs as nvh_tx_run_read (address-free reads). */
static int warm(nvh_pool *pool, void *arg)
{
    return nvh_tx_open_read(pool, arg, 8) ? NVH_OK : nvh_errcode();
}

/* Runs one reader transaction with the writer committing at h->at; returns
 * nvh_tx_run's code. */
static int handshake(int at, bool validate, hs *h)
{
    const char *path = test_path("txinplace-hs");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    *h = (hs){pool, bank_setup(pool), at, 0, 0, 0, 0, false};
    h->b->link = (uint64_t)((char *)&h->b->o[1] - (char *)h->b);
    /* the ownership records exist (a pool's first object transaction
     * allocates them, and reads with addresses) */
    assert_int_equal(nvh_tx_run(pool, warm, h->b), NVH_OK);
    pthread_t t;
    pthread_create(&t, NULL, hs_writer, h);
    nvh_tx_test_otm_no_validate_ = !validate;
    int rc;
    if (hs_read_run && hs_auto) {
        /* nvh_tx_run learns that hs_read only reads */
        hs_training = true;
        for (int i = 0; i < 3; i++) assert_int_equal(nvh_tx_run(pool, hs_read, h), NVH_OK);
        hs_training = false;
        h->attempts = 0;
        h->open_refused = false;
        rc = nvh_tx_run(pool, hs_read, h);
    } else {
        rc = hs_read_run ? nvh_tx_run_read(pool, hs_read, h) : nvh_tx_run(pool, hs_read, h);
    }
    nvh_tx_test_otm_no_validate_ = 0;
    if (atomic_load(&h->phase) == 0) atomic_store(&h->phase, 3);
    pthread_join(t, NULL);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
    return rc;
}

static void writer_between_opens(void **state)
{
    (void)state;
    hs h;
    assert_int_equal(handshake(AT_BETWEEN_OPENS, true, &h), NVH_OK);
    assert_int_equal(h.attempts, 2);               /* the first one aborted */
    assert_int_equal(h.a + h.c, 2 * INIT);
    assert_int_equal(h.a, INIT - 100);             /* the retry saw the writer */
}

static void writer_before_commit(void **state)
{
    (void)state;
    hs h;
    assert_int_equal(handshake(AT_BEFORE_COMMIT, true, &h), NVH_OK);
    assert_int_equal(h.attempts, 2);
    assert_int_equal(h.a + h.c, 2 * INIT);
}

/* The same with every read recorded (the path of a transaction whose first
 * open found a commit in flight). */
static void writer_between_opens_recorded(void **state)
{
    nvh_tx_test_otm_recorded_ = 1;
    writer_between_opens(state);
    writer_before_commit(state);
    nvh_tx_test_otm_recorded_ = 0;
}

/* Negative control: without validation the reader commits a mix. */
static void no_validation_commits_a_mix(void **state)
{
    (void)state;
    hs h;
    assert_int_equal(handshake(AT_BETWEEN_OPENS, false, &h), NVH_OK);
    assert_int_equal(h.attempts, 1);
    assert_int_not_equal(h.a + h.c, 2 * INIT);
    assert_int_equal(handshake(AT_BEFORE_COMMIT, false, &h), NVH_OK);
    assert_int_equal(h.attempts, 1);
    assert_int_not_equal(h.a + h.c, 2 * INIT);
}

/* A pointer from a changed object is a conflict, retried; the retry reads
 * the new link (outside the pool): the caller's error at last. */
static void doomed_pointer_retried(void **state)
{
    (void)state;
    hs h;
    assert_int_equal(handshake(AT_POINTER, true, &h), NVH_E_BADPTR);
    assert_int_equal(h.attempts, 2);
    /* without validation at the open, the first attempt fails at once */
    assert_int_equal(handshake(AT_POINTER, false, &h), NVH_E_BADPTR);
    assert_int_equal(h.attempts, 1);
}

/* The same through nvh_tx_run_read: its first attempt keeps no read set,
 * the clock word checked at each open and at the end stands for it. */
static void read_run_writer_between_opens(void **state)
{
    hs_read_run = true;
    writer_between_opens(state);
    writer_before_commit(state);
    /* validation at the later open: the doomed attempt stops there */
    hs h;
    assert_int_equal(handshake(AT_BETWEEN_OPENS, true, &h), NVH_OK);
    assert_true(h.open_refused);
    hs_read_run = false;
}

static void read_run_doomed_pointer_retried(void **state)
{
    hs_read_run = true;
    doomed_pointer_retried(state);
    hs_read_run = false;
}

static void read_run_no_validation_commits_a_mix(void **state)
{
    hs_read_run = true;
    no_validation_commits_a_mix(state);
    hs_read_run = false;
}

/* A read run that also writes a word (nvh_tx_write_word: no object write,
 * so its first attempt stays address-free up to the commit): the commit
 * validates the reads although the read set is empty. Without that, the
 * word written from a stale read commits (attempts 1, INIT). */
typedef struct rw_word { hs h; uint64_t seen; } rw_word;
static int read_then_word(nvh_pool *pool, void *arg)
{
    rw_word *r = arg;
    const obj *a = nvh_tx_open_read(pool, &r->h.b->o[0], sizeof(obj));
    if (!a) return nvh_errcode();
    r->seen = balance(a);
    if (hs_training) return NVH_OK;                /* read-only runs */
    let_writer_commit(&r->h);
    return nvh_tx_write_word(pool, &r->h.b->pad[0], r->seen);
}

static void read_run_word_write_validated(void **state)
{
    (void)state;
    const char *path = test_path("txinplace-rword");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    rw_word r = {{pool, bank_setup(pool), AT_BEFORE_COMMIT, 0, 0, 0, 0, false}, 0};
    assert_int_equal(nvh_tx_run(pool, warm, r.h.b), NVH_OK);
    pthread_t th;
    pthread_create(&th, NULL, hs_writer, &r.h);
    hs_read_run = true;
    if (hs_auto) {
        hs_training = true;
        for (int i = 0; i < 3; i++) assert_int_equal(nvh_tx_run(pool, read_then_word, &r), NVH_OK);
        hs_training = false;
        assert_int_equal(nvh_tx_run(pool, read_then_word, &r), NVH_OK);
    } else {
        assert_int_equal(nvh_tx_run_read(pool, read_then_word, &r), NVH_OK);
    }
    hs_read_run = false;
    pthread_join(th, NULL);
    assert_int_equal(r.h.attempts, 2);
    assert_int_equal(r.seen, INIT - 100);
    assert_int_equal(ld(&r.h.b->pad[0]), INIT - 100);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* The read_run_* tests again through plain nvh_tx_run, after runs of the
 * same function that only read: its first attempt is the address-free one
 * (asserted at the writer's handshake) and every guarantee holds. */
static void auto_writer_between_opens(void **state)
{
    hs_auto = true;
    read_run_writer_between_opens(state);
    hs_auto = false;
}

static void auto_doomed_pointer_retried(void **state)
{
    hs_auto = true;
    read_run_doomed_pointer_retried(state);
    hs_auto = false;
}

static void auto_no_validation_commits_a_mix(void **state)
{
    hs_auto = true;
    read_run_no_validation_commits_a_mix(state);
    hs_auto = false;
}

static void auto_word_write_validated(void **state)
{
    hs_auto = true;
    read_run_word_write_validated(state);
    hs_auto = false;
}

/* ---------------------------------------------------------------------------
 * nvh_tx_run's memory of its functions (which first attempt)
 * ------------------------------------------------------------------------- */
/* Reads o[0]; with write set, also adds 1 to every word of o[2] (in the
 * open's copy) and records whether the attempt was address-free. */
typedef struct rmw { bank *b; bool write; bool ro_seen; unsigned attempts; } rmw;
static int maybe_write(nvh_pool *pool, void *arg)
{
    rmw *m = arg;
    m->attempts++;
    m->ro_seen = reading_address_free();
    const obj *a = nvh_tx_open_read(pool, &m->b->o[0], sizeof(obj));
    if (!a || balance(a) == UINT64_MAX) return a ? NVH_E_INVAL : nvh_errcode();
    if (!m->write) return NVH_OK;
    obj *c = nvh_tx_open_write(pool, &m->b->o[2], sizeof(obj));
    if (!c) return nvh_errcode();
    for (unsigned k = 0; k < 8; k++) c->w[k]++;
    return NVH_OK;
}
static int only_read(nvh_pool *pool, void *arg)
{
    rmw *m = arg;
    m->ro_seen = reading_address_free();
    return nvh_tx_open_read(pool, &m->b->o[1], sizeof(obj)) ? NVH_OK : nvh_errcode();
}

static uint64_t retries(nvh_pool *pool)
{
    nvh_tx_stats st;
    assert_int_equal(nvh_tx_stats_get(pool, &st), NVH_OK);
    return st.retries;
}

/* One function read-only 99 times, then writing: the 100th run starts
 * address-free, its write retries it once as an ordinary attempt, and
 * commits exactly once (durable, after a reopen); the next writing run
 * starts ordinary (the memory learnt the write). A read-only function
 * interleaved on the same thread keeps its address-free start. A function
 * that alternates settles on the ordinary start. Fails with the memory
 * never learning a write (every writing run retried), or with a write
 * taken in the address-free attempt (no retry). */
static void auto_choice_learns_writes(void **state)
{
    (void)state;
    const char *path = test_path("txinplace-auto");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PMEM);
    assert_non_null(pool);
    bank *b = bank_setup(pool);
    assert_int_equal(nvh_tx_run(pool, warm, b), NVH_OK);
    rmw m = {b, false, false, 0};
    for (int i = 0; i < 99; i++) {
        assert_int_equal(nvh_tx_run(pool, maybe_write, &m), NVH_OK);
        assert_int_equal(m.ro_seen, i > 0);        /* learnt after one run */
    }
    uint64_t r0 = retries(pool);
    m.write = true;
    m.attempts = 0;
    assert_int_equal(nvh_tx_run(pool, maybe_write, &m), NVH_OK);
    assert_int_equal(m.attempts, 2);               /* address-free, then ordinary */
    assert_false(m.ro_seen);
    assert_int_equal(retries(pool) - r0, 1);
    assert_int_equal(balance(&b->o[2]), INIT + 1);
    /* the next writing runs start ordinary: no retry */
    for (int i = 0; i < 10; i++) {
        m.attempts = 0;
        assert_int_equal(nvh_tx_run(pool, maybe_write, &m), NVH_OK);
        assert_int_equal(m.attempts, 1);
        assert_false(m.ro_seen);
    }
    assert_int_equal(retries(pool) - r0, 1);
    assert_int_equal(balance(&b->o[2]), INIT + 11);

    /* a read-only and a writing function alternating on one thread */
    rmw q = {b, false, false, 0};
    for (int i = 0; i < 50; i++) {
        assert_int_equal(nvh_tx_run(pool, only_read, &q), NVH_OK);
        assert_int_equal(q.ro_seen, i > 0);
        m.attempts = 0;
        assert_int_equal(nvh_tx_run(pool, maybe_write, &m), NVH_OK);
        assert_int_equal(m.attempts, 1);
    }
    assert_int_equal(retries(pool) - r0, 1);
    assert_int_equal(balance(&b->o[2]), INIT + 61);

    /* one function alternating reads and writes: at most the first guess
     * after each read-only streak is wrong, and need grows */
    uint64_t r1 = retries(pool);
    for (int i = 0; i < 100; i++) {
        m.write = i % 2;
        assert_int_equal(nvh_tx_run(pool, maybe_write, &m), NVH_OK);
    }
    assert_true(retries(pool) - r1 <= 2);
    assert_int_equal(balance(&b->o[2]), INIT + 111);

    /* nvh_tx_run_read still starts address-free whatever the memory says */
    m.write = false;
    assert_int_equal(nvh_tx_run_read(pool, maybe_write, &m), NVH_OK);
    assert_true(m.ro_seen);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PMEM);
    assert_non_null(pool);
    b = nvh_ptr(pool, ((nvh_off_t *)nvh_root(pool, NULL))[0]);
    assert_int_equal(balance(&b->o[2]), INIT + 111);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* Negative control: with the memory never learning a write, every writing
 * run after the read-only streak runs twice. */
static void auto_sticky_memory_retries_every_write(void **state)
{
    (void)state;
    const char *path = test_path("txinplace-auto");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    bank *b = bank_setup(pool);
    rmw m = {b, false, false, 0};
    for (int i = 0; i < 5; i++) assert_int_equal(nvh_tx_run(pool, maybe_write, &m), NVH_OK);
    nvh_tx_test_fnmem_sticky_ = 1;
    m.write = true;
    uint64_t r0 = retries(pool);
    for (int i = 0; i < 5; i++) assert_int_equal(nvh_tx_run(pool, maybe_write, &m), NVH_OK);
    nvh_tx_test_fnmem_sticky_ = 0;
    assert_int_equal(retries(pool) - r0, 5);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* A function read-only until now reads an object address-free, another
 * thread commits a change to it, then the function writes a value derived
 * from its read: the address-free attempt must not take the write (it
 * could not validate the read); the retry reads the new value. Negative
 * control (nvh_tx_test_ro_write_): the write is taken and the other
 * thread's change is lost. */
typedef struct incr { hs h; bool write; } incr;
static int read_then_add(nvh_pool *pool, void *arg)
{
    incr *c = arg;
    const obj *a = nvh_tx_open_read(pool, &c->h.b->o[0], sizeof(obj));
    if (!a) return nvh_errcode();
    uint64_t v = balance(a);
    if (!c->write) return NVH_OK;
    if (c->h.attempts++ == 0) {
        assert_true(reading_address_free());
        atomic_store(&c->h.phase, 1);
        while (atomic_load(&c->h.phase) != 2) sched_yield();
    }
    obj *w = nvh_tx_open_write(pool, &c->h.b->o[0], sizeof(obj));
    if (!w) return nvh_errcode();
    for (unsigned k = 0; k < 8; k++) w->w[k] = v + 1;
    return NVH_OK;
}

static uint64_t write_after_read_only_streak(bool take_write)
{
    const char *path = test_path("txinplace-auto-hs");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    incr c = {{pool, bank_setup(pool), AT_BEFORE_COMMIT, 0, 0, 0, 0, false}, false};
    for (int i = 0; i < 99; i++) assert_int_equal(nvh_tx_run(pool, read_then_add, &c), NVH_OK);
    pthread_t t;
    pthread_create(&t, NULL, hs_writer, &c.h);     /* moves 100 out of o[0] */
    c.write = true;
    nvh_tx_test_ro_write_ = take_write;
    assert_int_equal(nvh_tx_run(pool, read_then_add, &c), NVH_OK);
    nvh_tx_test_ro_write_ = 0;
    pthread_join(t, NULL);
    assert_int_equal(c.h.attempts, take_write ? 1 : 2);
    uint64_t v = balance(&c.h.b->o[0]);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
    return v;
}

static void auto_write_after_reads_atomic(void **state)
{
    (void)state;
    assert_int_equal(write_after_read_only_streak(false), INIT - 100 + 1);
}

static void auto_ro_write_taken_loses_update(void **state)
{
    (void)state;
    assert_int_equal(write_after_read_only_streak(true), INIT + 1);
}

/* An error the transaction derived from a torn view is retried too. */
typedef struct torn { hs h; bool errored; } torn;
static int torn_read(nvh_pool *pool, void *arg)
{
    torn *t = arg;
    const obj *a = nvh_tx_open_read(pool, &t->h.b->o[0], sizeof(obj));
    const obj *c = a ? nvh_tx_open_read(pool, &t->h.b->o[1], sizeof(obj)) : NULL;
    if (!c) return nvh_errcode();
    uint64_t x = balance(a);
    let_writer_commit(&t->h);
    if (x + balance(c) != 2 * INIT) { t->errored = true; return NVH_E_INVAL; }
    return NVH_OK;
}

static void doomed_error_retried(void **state)
{
    (void)state;
    const char *path = test_path("txinplace-torn");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    torn t = {{pool, bank_setup(pool), AT_BEFORE_COMMIT, 0, 0, 0, 0, false}, false};
    pthread_t th;
    pthread_create(&th, NULL, hs_writer, &t.h);
    assert_int_equal(nvh_tx_run(pool, torn_read, &t), NVH_OK);
    pthread_join(th, NULL);
    assert_true(t.errored);
    assert_int_equal(t.h.attempts, 2);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Commits in flight: a two-fence object commit paused (test hook) after it
 * applied the first of its two objects in place
 * ------------------------------------------------------------------------- */
typedef struct fl {
    nvh_pool *pool;
    bank *b;
    _Atomic int phase;
    bool fail;                  /* the hook fails the commit after object 0 */
    unsigned attempts;
    uint64_t a, c;
    int wrc;                    /* the writer's nvh_tx_run code */
} fl;
static fl *fl_cur;

static void fl_wait(fl *f, int ph)
{
    while (atomic_load(&f->phase) < ph) sched_yield();
}

/* In the writer, after object i is in place: let the reader act, then
 * continue (or fail). */
static int fl_applied(unsigned i)
{
    fl *f = fl_cur;
    if (i != 0) return NVH_OK;
    atomic_store(&f->phase, 2);
    fl_wait(f, 3);
    return f->fail ? NVH_E_IO : NVH_OK;
}

/* 8 changed words per object, 16 in all: the two-fence commit */
static int fl_transfer(nvh_pool *pool, void *arg)
{
    fl *f = arg;
    obj *x = nvh_tx_open_write(pool, &f->b->o[0], sizeof(obj));
    obj *y = x ? nvh_tx_open_write(pool, &f->b->o[1], sizeof(obj)) : NULL;
    if (!y) return nvh_errcode();
    for (unsigned k = 0; k < 8; k++) { x->w[k] -= 100; y->w[k] += 100; }
    return NVH_OK;
}

static void *fl_writer(void *p)
{
    fl *f = p;
    fl_wait(f, 1);
    f->wrc = nvh_tx_run(f->pool, fl_transfer, f);
    atomic_store(&f->phase, 4);
    return NULL;
}

static nvh_pool *fl_setup(fl *f, bool fail, pthread_t *t)
{
    const char *path = test_path("txinplace-fl");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    *f = (fl){pool, bank_setup(pool), 0, fail, 0, 0, 0, 0};
    fl_cur = f;
    nvh_tx_test_otm_applied_ = fl_applied;
    pthread_create(t, NULL, fl_writer, f);
    return pool;
}

static void fl_done(fl *f, pthread_t t)
{
    pthread_join(t, NULL);
    nvh_tx_test_otm_applied_ = NULL;
    nvh_tx_test_otm_ignore_infl_ = 0;
    nvh_tx_test_otm_recorded_ = 0;
    nvh_tx_test_otm_abort_prev_ = 0;
    assert_int_equal(nvh_pool_close(f->pool), NVH_OK);
    unlink(test_path("txinplace-fl"));
}

static int fl_read_both(nvh_pool *pool, void *arg)
{
    fl *f = arg;
    f->attempts++;
    const obj *a = nvh_tx_open_read(pool, &f->b->o[0], sizeof(obj));
    const obj *c = a ? nvh_tx_open_read(pool, &f->b->o[1], sizeof(obj)) : NULL;
    if (!c) return nvh_errcode();
    f->a = balance(a);
    f->c = balance(c);
    return NVH_OK;
}

/* The reader begins while the writer is half applied; it may give up (one
 * attempt allowed) but must not commit the half. Returns its code. */
static int in_flight_reader(fl *f)
{
    fl_wait(f, 2);
    nvh_tx_config c;
    assert_int_equal(nvh_tx_config_get(f->pool, &c), NVH_OK);
    c.max_retries = 1;
    assert_int_equal(nvh_tx_config_set(f->pool, &c), NVH_OK);
    int rc = nvh_tx_run(f->pool, fl_read_both, f);
    atomic_store(&f->phase, 3);
    return rc;
}

static void in_flight_commit_recorded(void **state)
{
    (void)state;
    fl f;
    pthread_t t;
    fl_setup(&f, false, &t);
    atomic_store(&f.phase, 1);
    int rc = in_flight_reader(&f);
    fl_done(&f, t);
    assert_int_equal(f.wrc, NVH_OK);
    assert_true(rc == NVH_E_ABORTED || (rc == NVH_OK && f.a + f.c == 2 * INIT));
}

/* Negative control: a reader that ignores the commit in flight reads
 * unrecorded, finds the clock unchanged and commits the half. */
static void in_flight_ignored_commits_half(void **state)
{
    (void)state;
    fl f;
    pthread_t t;
    fl_setup(&f, false, &t);
    nvh_tx_test_otm_ignore_infl_ = 1;
    atomic_store(&f.phase, 1);
    int rc = in_flight_reader(&f);
    fl_done(&f, t);
    assert_int_equal(rc, NVH_OK);
    assert_int_equal(f.a, INIT - 100);
    assert_int_equal(f.c, INIT);
}

/* The reader opens object 0 first, reads it while the writer has it
 * applied, and commits after the writer failed and restored it. */
static int fl_read_transient(nvh_pool *pool, void *arg)
{
    fl *f = arg;
    const obj *a = nvh_tx_open_read(pool, &f->b->o[0], sizeof(obj));
    if (!a) return nvh_errcode();
    if (f->attempts++ == 0) {
        atomic_store(&f->phase, 1);                /* writer: go */
        fl_wait(f, 2);                             /* object 0 applied */
        f->a = balance(a);
        atomic_store(&f->phase, 3);                /* writer: fail now */
        fl_wait(f, 4);                             /* rolled back, released */
        return NVH_OK;
    }
    f->a = balance(a);
    return NVH_OK;
}

static void transient(bool recorded, bool abort_prev)
{
    fl f;
    pthread_t t;
    fl_setup(&f, true, &t);
    nvh_tx_test_otm_recorded_ = recorded;
    nvh_tx_test_otm_abort_prev_ = abort_prev;
    int rc = nvh_tx_run(f.pool, fl_read_transient, &f);
    fl_done(&f, t);
    assert_int_equal(f.wrc, NVH_E_IO);                     /* the injected failure */
    assert_int_equal(f.b ? rc : -1, NVH_OK);
    if (abort_prev) {
        assert_int_equal(f.attempts, 1);
        assert_int_equal(f.a, INIT - 100);                 /* never committed */
        return;
    }
    assert_int_equal(f.attempts, 2);
    assert_int_equal(f.a, INIT);
}

static void abort_after_apply_retries_reader(void **state)
{
    (void)state;
    transient(false, false);
    transient(true, false);
}

/* Negative control: released with the old words, the reader commits bytes
 * no transaction committed (both kinds of reads). */
static void abort_prev_commits_transient(void **state)
{
    (void)state;
    transient(false, true);
    transient(true, true);
}

/* ---------------------------------------------------------------------------
 * nvh_tx_run's end of a transaction that only read
 * ------------------------------------------------------------------------- */
typedef struct rw { bank *b; int kind; uint64_t *cell; } rw;
static int read_then_write(nvh_pool *pool, void *arg)
{
    rw *x = arg;
    const obj *a = nvh_tx_open_read(pool, &x->b->o[0], sizeof(obj));
    if (!a) return nvh_errcode();
    uint64_t v = balance(a) + 1 + (uint64_t)x->kind;
    switch (x->kind) {
    case 0: return nvh_tx_write_word(pool, &x->b->o[9].w[0], v);
    case 1: {
        int rc = nvh_tx_add_range(pool, &x->b->o[9].w[1], 8);
        if (rc == NVH_OK) x->b->o[9].w[1] = v;
        return rc;
    }
    default: {
        uint64_t *n = nvh_tx_alloc(pool, 64);
        if (!n) return nvh_errcode();
        n[0] = v;
        return nvh_tx_write_word(pool, &x->b->o[9].w[2], nvh_off(pool, n));
    }
    }
}

/* The word a kind writes, in place, or 0 for an allocation not made. */
static uint64_t rw_value(nvh_pool *pool, const bank *b, int kind)
{
    if (kind < 2) return b->o[9].w[kind];
    uint64_t off = b->o[9].w[2];
    return off == INIT ? 0 : *(const uint64_t *)((const char *)nvh_pool_base(pool) + off);
}

static void run_commits_every_write_kind(void **state)
{
    (void)state;
    const char *path = test_path("txinplace-rw");
    for (int k = 0; k < 3; k++) {
        nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PMEM);
        assert_non_null(pool);
        bank *b = bank_setup(pool);
        rw x = {b, k, NULL};
        assert_int_equal(nvh_tx_run(pool, read_then_write, &x), NVH_OK);
        /* committed when the call returns: in place, the descriptor ended */
        assert_int_equal(nvh_tx_stage_get(pool), NVH_TX_NONE);
        assert_int_equal(nvh_tx_depth(pool), 0);
        assert_int_equal(rw_value(pool, b, k), INIT + 1 + (uint64_t)k);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        /* and durable: nothing rolled back or freed at the reopen */
        pool = nvh_pool_open(path, LAYOUT, 0);
        assert_non_null(pool);
        nvh_off_t *root = nvh_root(pool, NULL);
        b = (bank *)((char *)nvh_pool_base(pool) + root[0]);
        assert_int_equal(rw_value(pool, b, k), INIT + 1 + (uint64_t)k);
        if (k == 2) assert_true(nvh_usable_size(pool, (char *)nvh_pool_base(pool) + b->o[9].w[2]) >= 64);
        /* the read-only end leaves the descriptor ready for the next */
        for (int i = 0; i < 3; i++) assert_int_equal(nvh_tx_run(pool, read_two, b), NVH_OK);
        assert_int_equal(nvh_tx_stage_get(pool), NVH_TX_NONE);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        unlink(path);
    }
}

/* The unrecorded open checks the bounds nvh_tx_run bound at its begin
 * (the pool's data then): every pointer it refuses takes the full checks,
 * which report the caller's error (nothing changed under it), and memory
 * the pool grew into after the binding is still opened. */
typedef struct bounds { bank *b; int step; } bounds;
static int open_bounds(nvh_pool *pool, void *arg)
{
    bounds *x = arg;
    char *base = nvh_pool_base(pool);
    uint64_t size = nvh_pool_size(pool);
    switch (x->step) {
    case 0: return nvh_tx_open_read(pool, &x->b->o[0], sizeof(obj)) ? NVH_OK : nvh_errcode();
    case 1: return nvh_tx_open_read(pool, base + size - 8, 8) == base + size - 8 ? NVH_OK : NVH_E_IO;
    case 2: return nvh_tx_open_read(pool, base + size - 8, 16) ? NVH_E_IO : nvh_errcode();
    case 3: return nvh_tx_open_read(pool, base + 64, 8) ? NVH_E_IO : nvh_errcode();  /* header */
    case 4: return nvh_tx_open_read(pool, base - 64, 8) ? NVH_E_IO : nvh_errcode();
    case 5: return nvh_tx_open_read(pool, &x->b->o[0], 0) ? NVH_E_IO : nvh_errcode();
    case 6: return nvh_tx_open_read(pool, &x->b->o[0], SIZE_MAX) ? NVH_E_IO : nvh_errcode();
    case 7: return nvh_tx_open_read(pool, &x->b->o[0], size) ? NVH_E_IO : nvh_errcode();
    default: {
        /* grown after the binding: the new end is inside */
        if (!nvh_tx_open_read(pool, &x->b->o[0], sizeof(obj))) return nvh_errcode();
        int rc = nvh_pool_grow(pool, size + 4 * MIB);
        if (rc != NVH_OK) return rc;
        const void *p = nvh_tx_open_read(pool, base + size + MIB, 64);
        return p == base + size + MIB && nvh_pool_size(pool) == size + 4 * MIB ? NVH_OK : NVH_E_IO;
    }
    }
}

static void run_open_bounds(void **state)
{
    (void)state;
    const char *path = test_path("txinplace-bounds");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PMEM);
    assert_non_null(pool);
    bounds x = {bank_setup(pool), 0};
    static const int want[] = {NVH_OK,        NVH_OK,       NVH_E_BADPTR, NVH_E_BADPTR, NVH_E_BADPTR,
                               NVH_E_INVAL,   NVH_E_BADPTR, NVH_E_BADPTR, NVH_OK};
    for (x.step = 0; x.step < 9; x.step++) {
        assert_int_equal(nvh_tx_run(pool, open_bounds, &x), want[x.step]);
        assert_int_equal(nvh_tx_stage_get(pool), NVH_TX_NONE);
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* nvh_tx_run keeps the thread's descriptor between runs; a pool closed and
 * another opened (the handle's memory reused) must not get the old one. */
static int bump_first(nvh_pool *pool, void *arg)
{
    bank *b = arg;
    obj *o = nvh_tx_open_write(pool, &b->o[0], sizeof(obj));
    if (!o) return nvh_errcode();
    for (unsigned k = 0; k < 8; k++) o->w[k]++;
    return NVH_OK;
}

static void run_after_close(void **state)
{
    (void)state;
    const char *p1 = test_path("txinplace-c1"), *p2 = test_path("txinplace-c2");
    unsigned same = 0;
    for (int round = 0; round < 8; round++) {
        nvh_pool *a = nvh_pool_create(p1, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS);
        assert_non_null(a);
        bank *ba = bank_setup(a);
        assert_int_equal(nvh_tx_run(a, bump_first, ba), NVH_OK);
        assert_int_equal(nvh_pool_close(a), NVH_OK);
        nvh_pool *b = nvh_pool_create(p2, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS);
        assert_non_null(b);
        same += b == a;
        bank *bb = bank_setup(b);
        assert_int_equal(nvh_tx_run(b, bump_first, bb), NVH_OK);
        assert_int_equal(nvh_tx_run(b, read_two, bb), NVH_E_INVAL);   /* o[0] moved on */
        assert_int_equal(balance(&bb->o[0]), INIT + 1);
        assert_int_equal(nvh_pool_close(b), NVH_OK);
        unlink(p1);
        unlink(p2);
    }
    print_message("  %u of 8 rounds reused the closed pool's handle\n", same);
}

/* ---------------------------------------------------------------------------
 * No reuse under a reader
 * ------------------------------------------------------------------------- */
typedef struct reuse { nvh_pool *pool; void *victim; _Atomic int step; int reused; } reuse;
static int free_victim(nvh_pool *pool, void *arg)
{
    return nvh_tx_free(pool, arg);
}
static void *reuse_thread(void *p)
{
    reuse *r = p;
    while (atomic_load(&r->step) != 1) sched_yield();
    assert_int_equal(nvh_tx_run(r->pool, free_victim, r->victim), NVH_OK);
    /* allocate the size again and again: the victim's slot must not come back */
    void *got[2000];
    for (unsigned i = 0; i < 2000; i++) {
        got[i] = nvh_alloc(r->pool, sizeof(obj), NULL, NULL, NULL);
        assert_non_null(got[i]);
        if (got[i] == r->victim) r->reused++;
    }
    for (unsigned i = 0; i < 2000; i++) nvh_free(r->pool, got[i], NULL, 0);
    atomic_store(&r->step, 2);
    return NULL;
}

static int hold_victim(nvh_pool *pool, void *arg)
{
    reuse *r = arg;
    const obj *v = nvh_tx_open_read(pool, r->victim, sizeof(obj));
    if (!v) return nvh_errcode();
    atomic_store(&r->step, 1);
    while (atomic_load(&r->step) != 2) sched_yield();
    return NVH_OK;
}

static void no_reuse_under_reader(void **state)
{
    (void)state;
    const char *path = test_path("txinplace-reuse");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_heap_config hc;
    assert_int_equal(nvh_heap_config_get(pool, &hc), NVH_OK);
    hc.fifo_delay_ns = 0;                          /* reuse at once when allowed */
    hc.fifo_max_bytes = 0;
    assert_int_equal(nvh_heap_config_set(pool, &hc), NVH_OK);
    reuse r = {pool, nvh_alloc(pool, sizeof(obj), NULL, NULL, NULL), 0, 0};
    assert_non_null(r.victim);
    pthread_t t;
    pthread_create(&t, NULL, reuse_thread, &r);
    assert_int_equal(nvh_tx_run(pool, hold_victim, &r), NVH_OK);
    pthread_join(t, NULL);
    assert_int_equal(r.reused, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* A reader thread that ran object transactions and then went idle (alive)
 * keeps its epoch slot announced (sticky, common/epoch.c); space freed
 * after it left must still come back: the scans revoke it. Returns how many
 * allocations it took to get the victim's space back (0: never, in 20,000). */
typedef struct idle { nvh_pool *pool; bank *b; _Atomic int step; } idle;
static void *idle_reader(void *p)
{
    idle *r = p;
    for (int i = 0; i < 3; i++) assert_int_equal(nvh_tx_run(r->pool, read_two, r->b), NVH_OK);
    atomic_store(&r->step, 1);
    while (atomic_load(&r->step) != 2) sched_yield();   /* idle, alive */
    return NULL;
}

static unsigned reuse_after_idle_reader(void)
{
    const char *path = test_path("txinplace-idle");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_heap_config hc;
    assert_int_equal(nvh_heap_config_get(pool, &hc), NVH_OK);
    hc.fifo_delay_ns = 0;
    hc.fifo_max_bytes = 0;                         /* every free drains */
    assert_int_equal(nvh_heap_config_set(pool, &hc), NVH_OK);
    idle r = {pool, bank_setup(pool), 0};
    pthread_t t;
    pthread_create(&t, NULL, idle_reader, &r);
    while (atomic_load(&r.step) != 1) sched_yield();
    void *victim = nvh_alloc(pool, sizeof(obj), NULL, NULL, NULL);
    assert_non_null(victim);
    nvh_free(pool, victim, NULL, 0);
    unsigned found = 0;
    for (unsigned i = 1; i <= 20000 && !found; i++) {
        void *p = nvh_alloc(pool, sizeof(obj), NULL, NULL, NULL);
        assert_non_null(p);
        if (p == victim) found = i;
        nvh_free(pool, p, NULL, 0);
    }
    atomic_store(&r.step, 2);
    pthread_join(t, NULL);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
    return found;
}

static bool have_membarrier(void)
{
    long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0);
    return q > 0 && (q & MEMBARRIER_CMD_PRIVATE_EXPEDITED);
}

static void idle_reader_revoked(void **state)
{
    (void)state;
    unsigned n = reuse_after_idle_reader();
    print_message("  the victim's space came back after %u allocations\n", n);
    assert_true(n > 0);
}

/* Negative control: without revocation the idle reader holds it for good. */
static void idle_reader_no_revoke_holds(void **state)
{
    (void)state;
    if (!have_membarrier()) {                      /* readers are never sticky */
        print_message("  membarrier not available: skipped\n");
        return;
    }
    nvh_epoch_test_no_revoke_ = 1;
    unsigned n = reuse_after_idle_reader();
    nvh_epoch_test_no_revoke_ = 0;
    assert_int_equal(n, 0);
}

/* ---------------------------------------------------------------------------
 * Stress (TSan): readers in place, writers committing to the same objects
 * ------------------------------------------------------------------------- */
#if defined(__SANITIZE_THREAD__)
#define ITERS 1500u
#else
#define ITERS 20000u
#endif

typedef struct sw { nvh_pool *pool; bank *b; uint64_t rng; unsigned id; int fails; } sw;
static uint64_t mix(uint64_t *s)
{
    uint64_t x = *s += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    return x ^ (x >> 31);
}
static void *stress_writer(void *p)
{
    sw *w = p;
    for (unsigned i = 0; i < ITERS; i++) {
        xfer x = {w->b, (unsigned)(mix(&w->rng) % NOBJ), 0, 1 + mix(&w->rng) % 50};
        do x.to = (unsigned)(mix(&w->rng) % NOBJ); while (x.to == x.from);
        if (nvh_tx_run(w->pool, transfer, &x) != NVH_OK) w->fails++;
    }
    return NULL;
}

typedef struct sr {
    nvh_pool *pool; bank *b; _Atomic int *stop; uint64_t ok, bad, runs;
    bool read_run;              /* nvh_tx_run_read (address-free first attempts) */
    bool mixed;                 /* every 8th run of sum_inplace also transfers */
} sr;
typedef struct sum { bank *b; uint64_t total; bool torn; xfer *x; } sum;
static int sum_inplace(nvh_pool *pool, void *arg)
{
    sum *s = arg;
    s->total = 0;
    s->torn = false;
    if (s->x) {
        /* the same function writes now and then: nvh_tx_run's memory of
         * it flips between its first attempts */
        int rc = transfer(pool, s->x);
        if (rc != NVH_OK) return rc;
    }
    for (unsigned i = 0; i < NOBJ; i++) {
        const obj *o = nvh_tx_open_read(pool, &s->b->o[i], sizeof(obj));
        if (!o) return nvh_errcode();
        uint64_t v = balance(o);
        if (v == UINT64_MAX) s->torn = true;
        else s->total += v;
    }
    return NVH_OK;
}
static void *stress_reader(void *p)
{
    sr *r = p;
    uint64_t rng = 99;
    while (!atomic_load(r->stop)) {
        xfer x = {r->b, (unsigned)(mix(&rng) % NOBJ), 0, 1 + mix(&rng) % 50};
        do x.to = (unsigned)(mix(&rng) % NOBJ); while (x.to == x.from);
        sum s = {r->b, 0, false, r->mixed && r->runs % 8 == 7 ? &x : NULL};
        r->runs++;
        int rc = r->read_run ? nvh_tx_run_read(r->pool, sum_inplace, &s)
                             : nvh_tx_run(r->pool, sum_inplace, &s);
        if (rc != NVH_OK) { r->bad++; continue; }
        if (s.torn || s.total != (uint64_t)NOBJ * INIT) r->bad++;
        else r->ok++;
    }
    return NULL;
}

static void stress(void **state)
{
    (void)state;
    const char *path = test_path("txinplace-stress");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    bank *b = bank_setup(pool);
    enum { W = 2, R = 3 };
    _Atomic int stop = 0;
    sw w[W];
    sr r[R];
    pthread_t tw[W], tr[R];
    for (unsigned i = 0; i < W; i++) {
        w[i] = (sw){pool, b, 11 + i, i, 0};
        pthread_create(&tw[i], NULL, stress_writer, &w[i]);
    }
    for (unsigned i = 0; i < R; i++) {
        r[i] = (sr){pool, b, &stop, 0, 0, 0, i == 1, i == 2};
        pthread_create(&tr[i], NULL, stress_reader, &r[i]);
    }
    for (unsigned i = 0; i < W; i++) pthread_join(tw[i], NULL);
    atomic_store(&stop, 1);
    uint64_t ok = 0;
    for (unsigned i = 0; i < R; i++) {
        pthread_join(tr[i], NULL);
        assert_int_equal(r[i].bad, 0);
        ok += r[i].ok;
    }
    for (unsigned i = 0; i < W; i++) assert_int_equal(w[i].fails, 0);
    uint64_t t = 0;
    for (unsigned i = 0; i < NOBJ; i++) {
        assert_int_not_equal(balance(&b->o[i]), UINT64_MAX);
        t += balance(&b->o[i]);
    }
    assert_int_equal(t, (uint64_t)NOBJ * INIT);
    nvh_tx_stats st;
    nvh_tx_stats_get(pool, &st);
    print_message("  %llu consistent read-only commits, %llu conflicts, %llu retries\n",
                  (unsigned long long)ok, (unsigned long long)st.conflicts,
                  (unsigned long long)st.retries);
    assert_true(ok > 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(costs),
        cmocka_unit_test(writer_between_opens),
        cmocka_unit_test(writer_before_commit),
        cmocka_unit_test(writer_between_opens_recorded),
        cmocka_unit_test(no_validation_commits_a_mix),
        cmocka_unit_test(in_flight_commit_recorded),
        cmocka_unit_test(in_flight_ignored_commits_half),
        cmocka_unit_test(abort_after_apply_retries_reader),
        cmocka_unit_test(abort_prev_commits_transient),
        cmocka_unit_test(run_commits_every_write_kind),
        cmocka_unit_test(run_after_close),
        cmocka_unit_test(run_open_bounds),
        cmocka_unit_test(doomed_pointer_retried),
        cmocka_unit_test(doomed_error_retried),
        cmocka_unit_test(read_run_writer_between_opens),
        cmocka_unit_test(read_run_doomed_pointer_retried),
        cmocka_unit_test(read_run_no_validation_commits_a_mix),
        cmocka_unit_test(read_run_word_write_validated),
        cmocka_unit_test(auto_writer_between_opens),
        cmocka_unit_test(auto_doomed_pointer_retried),
        cmocka_unit_test(auto_no_validation_commits_a_mix),
        cmocka_unit_test(auto_word_write_validated),
        cmocka_unit_test(auto_choice_learns_writes),
        cmocka_unit_test(auto_sticky_memory_retries_every_write),
        cmocka_unit_test(auto_write_after_reads_atomic),
        cmocka_unit_test(auto_ro_write_taken_loses_update),
        cmocka_unit_test(no_reuse_under_reader),
        cmocka_unit_test(idle_reader_revoked),
        cmocka_unit_test(idle_reader_no_revoke_holds),
        cmocka_unit_test(stress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
