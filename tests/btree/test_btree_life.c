/* test_btree_life.c — the B+ tree's life cycle and its promises across
 * processes: puts durable when they return (a real SIGKILL at a random
 * moment loses no acknowledged key), nvh_pool_close with trees still open,
 * a second open of an open tree, use from another thread, bad value
 * lengths, read-only pools, and slab space shared by many short processes
 * (some of them killed).
 */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "btree_test.h"

static nvh_pool *new_pool(const char *name, const char **path, uint64_t size)
{
    *path = test_path(name);
    nvh_pool *pool = nvh_pool_create(*path, BT_LAYOUT, size, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    return pool;
}

static void value_of(uint64_t key, unsigned char v[32])
{
    for (unsigned i = 0; i < 32; i++) v[i] = (unsigned char)(key * 31 + i);
}

static void expect_key(nvh_btree *t, uint64_t key)
{
    const void *p;
    size_t len;
    unsigned char want[32];
    value_of(key, want);
    if (nvh_btree_get(t, key, &p, &len) != NVH_OK) fail_msg("key %llu lost", (unsigned long long)key);
    assert_int_equal(len, 32);
    assert_memory_equal(p, want, 32);
}

/* 1,000 puts, then nvh_pool_close without nvh_btree_close: every key is
 * there after reopening, in both durabilities (the deferred one is made
 * durable by the pool's close hook). */
static void pool_close_with_tree_open(void **state)
{
    (void)state;
    for (int deferred = 0; deferred < 2; deferred++) {
        const char *path;
        nvh_pool *pool = new_pool("bt-life-close", &path, 16u << 20);
        nvh_btree_options o = {.durability = deferred ? NVH_BTREE_DURABLE_DEFERRED
                                                      : NVH_BTREE_DURABLE_ON_RETURN};
        nvh_btree *t = nvh_btree_open(pool, "t", 1, &o);
        assert_non_null(t);
        unsigned char v[32];
        for (uint64_t k = 0; k < 1000; k++) {
            value_of(k, v);
            assert_int_equal(nvh_btree_put(t, k, v, sizeof v), NVH_OK);
        }
        if (!deferred) assert_int_equal(nvh_btree_durable(t), 1000);   /* on return */
        assert_int_equal(nvh_pool_close(pool), NVH_OK);               /* t closed too */
        pool = nvh_pool_open(path, BT_LAYOUT, NVH_DOMAIN_PROCESS);
        assert_non_null(pool);
        t = nvh_btree_open(pool, "t", 0, NULL);
        assert_non_null(t);
        assert_int_equal(nvh_btree_count(t), 1000);
        for (uint64_t k = 0; k < 1000; k++) expect_key(t, k);
        assert_int_equal(nvh_btree_check(t), NVH_OK);
        assert_int_equal(nvh_btree_close(t), NVH_OK);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        unlink(path);
    }
}

/* Opening an open tree again gives the same handle: puts alternating
 * through both names all land; each open is closed once. */
static void double_open(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("bt-life-double", &path, 16u << 20);
    nvh_btree *a = nvh_btree_open(pool, "t", 1, NULL);
    nvh_btree *b = nvh_btree_open(pool, "t", 0, NULL);
    assert_non_null(a);
    assert_ptr_equal(a, b);
    unsigned char v[32];
    for (uint64_t k = 0; k < 1000; k++) {
        value_of(k, v);
        assert_int_equal(nvh_btree_put(k & 1 ? b : a, k, v, sizeof v), NVH_OK);
    }
    /* other options: refused, the open handle is untouched */
    nvh_btree_options other = {.durability = NVH_BTREE_DURABLE_DEFERRED};
    assert_null(nvh_btree_open(pool, "t", 0, &other));
    assert_int_equal(nvh_errcode(), NVH_E_BUSY);
    assert_int_equal(nvh_btree_close(b), NVH_OK);
    for (uint64_t k = 0; k < 1000; k++) expect_key(a, k);     /* a still open */
    assert_int_equal(nvh_btree_close(a), NVH_OK);
    /* both closed: a new open is a new handle that sees every key */
    nvh_btree *c = nvh_btree_open(pool, "t", 0, NULL);
    assert_non_null(c);
    assert_int_equal(nvh_btree_count(c), 1000);
    for (uint64_t k = 0; k < 1000; k++) expect_key(c, k);
    assert_int_equal(nvh_btree_check(c), NVH_OK);
    assert_int_equal(nvh_btree_close(c), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* Another thread: a clear error in the tree's terms, nothing changed. */
typedef struct thread_arg {
    nvh_btree *t;
    int put_rc, get_rc, del_rc;
    char msg[512];
} thread_arg;

static void *other_thread(void *p)
{
    thread_arg *a = p;
    unsigned char v[32];
    value_of(5, v);
    a->put_rc = nvh_btree_put(a->t, 5, v, sizeof v);
    snprintf(a->msg, sizeof a->msg, "%s", nvh_errormsg());
    a->get_rc = nvh_btree_get(a->t, 1, NULL, NULL);
    a->del_rc = nvh_btree_delete(a->t, 1);
    return NULL;
}

static void second_thread(void **state)
{
    (void)state;
    for (int deferred = 0; deferred < 2; deferred++) {
        const char *path;
        nvh_pool *pool = new_pool("bt-life-thread", &path, 16u << 20);
        nvh_btree_options o = {.durability = deferred ? NVH_BTREE_DURABLE_DEFERRED
                                                      : NVH_BTREE_DURABLE_ON_RETURN};
        nvh_btree *t = nvh_btree_open(pool, "users", 1, &o);
        assert_non_null(t);
        unsigned char v[32];
        value_of(1, v);
        assert_int_equal(nvh_btree_put(t, 1, v, sizeof v), NVH_OK);
        thread_arg a = {.t = t};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, other_thread, &a), 0);
        assert_int_equal(pthread_join(th, NULL), 0);
        printf("  %s: %s\n", deferred ? "deferred" : "default", a.msg);
        assert_int_equal(a.put_rc, NVH_E_BUSY);
        assert_int_equal(a.get_rc, NVH_E_BUSY);
        assert_int_equal(a.del_rc, NVH_E_BUSY);
        assert_non_null(strstr(a.msg, "btree 'users'"));
        assert_non_null(strstr(a.msg, "thread"));
        assert_null(strstr(a.msg, "group"));                   /* no internal word */
        assert_int_equal(nvh_btree_count(t), 1);
        expect_key(t, 1);
        assert_int_equal(nvh_btree_close(t), NVH_OK);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        unlink(path);
    }
}

/* nvh_pool_close from another thread than a deferred tree's: refused with
 * NVH_E_BUSY and nothing changes; once the tree is closed it succeeds. */
typedef struct opener {
    nvh_pool *pool;
    nvh_btree *t;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stage;
} opener;

static void stage_wait(opener *o, int s)
{
    pthread_mutex_lock(&o->mu);
    while (o->stage < s) pthread_cond_wait(&o->cv, &o->mu);
    pthread_mutex_unlock(&o->mu);
}
static void stage_set(opener *o, int s)
{
    pthread_mutex_lock(&o->mu);
    o->stage = s;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static void *opener_thread(void *p)
{
    opener *o = p;
    nvh_btree_options opt = {.durability = NVH_BTREE_DURABLE_DEFERRED};
    o->t = nvh_btree_open(o->pool, "t", 1, &opt);
    unsigned char v[32];
    for (uint64_t k = 0; o->t && k < 100; k++) {
        value_of(k, v);
        nvh_btree_put(o->t, k, v, sizeof v);
    }
    stage_set(o, 1);
    stage_wait(o, 2);
    nvh_btree_close(o->t);
    stage_set(o, 3);
    return NULL;
}

static void pool_close_refused(void **state)
{
    (void)state;
    const char *path;
    opener o = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    o.pool = new_pool("bt-life-refuse", &path, 16u << 20);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, opener_thread, &o), 0);
    stage_wait(&o, 1);
    assert_non_null(o.t);
    assert_int_equal(nvh_pool_close(o.pool), NVH_E_BUSY);
    printf("  %s\n", nvh_errormsg());
    stage_set(&o, 2);
    stage_wait(&o, 3);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(nvh_pool_close(o.pool), NVH_OK);
    nvh_pool *pool = nvh_pool_open(path, BT_LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_btree *t = nvh_btree_open(pool, "t", 0, NULL);
    assert_non_null(t);
    assert_int_equal(nvh_btree_count(t), 100);
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* A value too long: NVH_E_TOOLONG, the tree and the pool unchanged. */
static void too_long(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("bt-life-long", &path, 16u << 20);
    nvh_btree *t = nvh_btree_open(pool, "t", 1, NULL);
    assert_non_null(t);
    unsigned char v[32];
    value_of(1, v);
    assert_int_equal(nvh_btree_put(t, 1, v, sizeof v), NVH_OK);
    nvh_heap_stats before, after;
    assert_int_equal(nvh_heap_stats_get(pool, &before), NVH_OK);
    assert_int_equal(nvh_btree_put(t, 2, v, SIZE_MAX), NVH_E_TOOLONG);
    assert_int_equal(nvh_btree_put(t, 1, v, SIZE_MAX), NVH_E_TOOLONG);
    assert_int_equal(nvh_btree_put(t, 3, v, (size_t)NVH_BTREE_VALUE_MAX + 1), NVH_E_TOOLONG);
    assert_int_equal(nvh_heap_stats_get(pool, &after), NVH_OK);
    assert_int_equal(before.live_bytes, after.live_bytes);
    assert_int_equal(nvh_btree_ops(t), 1);
    assert_int_equal(nvh_btree_count(t), 1);
    expect_key(t, 1);
    assert_int_equal(nvh_btree_get(t, 2, NULL, NULL), NVH_E_NOTFOUND);
    assert_int_equal(nvh_btree_check(t), NVH_OK);
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* A read-only pool, default options: reads work, writes fail, the file is
 * not modified. */
static int count_cb(uint64_t key, const void *value, size_t len, void *arg)
{
    (void)key; (void)value; (void)len;
    ++*(uint64_t *)arg;
    return 0;
}

static void read_only(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("bt-life-ro", &path, 16u << 20);
    nvh_btree *t = nvh_btree_open(pool, "t", 1, NULL);
    assert_non_null(t);
    unsigned char v[32];
    for (uint64_t k = 0; k < 500; k++) {
        value_of(k, v);
        assert_int_equal(nvh_btree_put(t, k, v, sizeof v), NVH_OK);
    }
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    uint64_t h0 = test_file_hash(path);
    pool = nvh_pool_open(path, BT_LAYOUT, NVH_DOMAIN_PROCESS | NVH_OPEN_READONLY);
    assert_non_null(pool);
    assert_null(nvh_btree_open(pool, "absent", 1, NULL));
    assert_int_equal(nvh_errcode(), NVH_E_READONLY);
    t = nvh_btree_open(pool, "t", 0, NULL);
    if (!t) fail_msg("read-only open: %s", nvh_errormsg());
    assert_int_equal(nvh_btree_count(t), 500);
    for (uint64_t k = 0; k < 500; k++) expect_key(t, k);
    uint64_t n = 0;
    assert_int_equal(nvh_btree_scan(t, 0, UINT64_MAX, count_cb, &n), 0);
    assert_int_equal(n, 500);
    assert_int_equal(nvh_btree_check(t), NVH_OK);
    assert_int_equal(nvh_btree_put(t, 1000, v, sizeof v), NVH_E_READONLY);
    assert_int_equal(nvh_btree_put(t, 1, v, sizeof v), NVH_E_READONLY);
    assert_int_equal(nvh_btree_delete(t, 1), NVH_E_READONLY);
    assert_int_equal(nvh_btree_reclaim(t), NVH_E_READONLY);
    assert_int_equal(nvh_btree_sync(t), NVH_OK);
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    /* deferred options on a read-only pool open too (nothing to defer) */
    nvh_btree_options d = {.durability = NVH_BTREE_DURABLE_DEFERRED};
    t = nvh_btree_open(pool, "t", 0, &d);
    assert_non_null(t);
    expect_key(t, 7);
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    assert_true(test_file_hash(path) == h0);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Real processes
 * ------------------------------------------------------------------------- */
/* A child puts keys and reports each acknowledged one over a pipe (the
 * default: when put returns; deferred: when the durable watermark passes
 * it); the parent SIGKILLs it at a random moment, reopens the pool and
 * checks that every reported key is there with its value. */
static int g_ack_fd;
static uint64_t g_base;
static void report_durable(nvh_btree *t, uint64_t durable, void *arg)
{
    (void)t; (void)arg;
    /* op n is the put of key g_base + n - 1 (one put per key) */
    uint64_t v = g_base + durable;                 /* keys < v are durable */
    if (write(g_ack_fd, &v, sizeof v) != sizeof v) _exit(9);
}

static void child_putter(const char *path, int fd, int deferred, uint64_t base)
{
    nvh_pool *pool = nvh_pool_open(path, BT_LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) _exit(2);
    nvh_btree_options o = {.durability = deferred ? NVH_BTREE_DURABLE_DEFERRED
                                                  : NVH_BTREE_DURABLE_ON_RETURN};
    nvh_btree *t = nvh_btree_open(pool, "k", 1, &o);
    if (!t) _exit(3);
    g_ack_fd = fd;
    g_base = base;
    if (deferred) nvh_btree_set_durable_fn(t, report_durable, NULL);
    unsigned char v[32];
    for (uint64_t k = base;; k++) {
        value_of(k, v);
        if (nvh_btree_put(t, k, v, sizeof v) != NVH_OK) _exit(4);
        if (!deferred) {
            uint64_t next = k + 1;                 /* keys < next are durable */
            if (write(fd, &next, sizeof next) != sizeof next) _exit(5);
        }
    }
}

static void sigkill_round(const char *path, int deferred, uint64_t base, uint64_t *seed)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        child_putter(path, p[1], deferred, base);
    }
    close(p[1]);
    /* let it run for a random number of acknowledgements, then kill it
     * while it keeps putting */
    uint64_t target = 200 + test_rand(seed) % 3000, acked = base, v;
    while (acked < base + target && read(p[0], &v, sizeof v) == sizeof v) acked = v;
    struct timespec ts = {0, (long)(test_rand(seed) % 200000)};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    while (read(p[0], &v, sizeof v) == sizeof v) acked = v > acked ? v : acked;
    close(p[0]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    nvh_pool *pool = nvh_pool_open(path, BT_LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_btree *t = nvh_btree_open(pool, "k", 0, NULL);
    assert_non_null(t);
    for (uint64_t k = base; k < acked; k++) expect_key(t, k);
    assert_int_equal(nvh_btree_check(t), NVH_OK);
    printf("  %s: killed after %llu acknowledged puts, all present (tree holds %llu)\n",
           deferred ? "deferred" : "default", (unsigned long long)(acked - base),
           (unsigned long long)nvh_btree_count(t));
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

static void sigkill_acknowledged(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("bt-life-kill", &path, 64u << 20);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    uint64_t seed = 0x5eed;
    for (int round = 0; round < 6; round++)
        sigkill_round(path, round % 3 == 2, (uint64_t)round << 32, &seed);
    unlink(path);
}

/* 200 short processes, each: open the pool and the tree, a few puts and
 * deletes over 64 keys, close (every 8th is SIGKILLed in the middle
 * instead). Slabs left partly filled are reused by the next process, so
 * the tree's slab space grows with the bytes written (plus at most
 * BT_FILL_STEP per killed process), not by a 64 KiB slab per process; the
 * eager reclaim then frees every slab without a live record. */
static void short_process(const char *path, int idx)
{
    nvh_pool *pool = nvh_pool_open(path, BT_LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) _exit(2);
    nvh_btree *t = nvh_btree_open(pool, "s", 1, NULL);
    if (!t) _exit(3);
    unsigned char v[32];
    for (int i = 0; i < 5; i++) {
        uint64_t k = (uint64_t)(idx * 7 + i * 13) % 64;
        value_of(k, v);
        if (nvh_btree_put(t, k, v, sizeof v) != NVH_OK) _exit(4);
        if (idx % 8 == 3 && i == 2) raise(SIGKILL);
    }
    for (int i = 0; i < 2; i++) {
        int rc = nvh_btree_delete(t, (uint64_t)(idx * 11 + i) % 64);
        if (rc != NVH_OK && rc != NVH_E_NOTFOUND) _exit(5);
    }
    if (nvh_btree_close(t) != NVH_OK || nvh_pool_close(pool) != NVH_OK) _exit(6);
    _exit(0);
}

static void many_short_processes(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("bt-life-short", &path, 64u << 20);
    nvh_heap_stats h0;
    nvh_btree *t = nvh_btree_open(pool, "s", 1, NULL);
    assert_non_null(t);
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    assert_int_equal(nvh_heap_stats_get(pool, &h0), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    enum { PROCS = 200 };
    int killed = 0;
    for (int i = 0; i < PROCS; i++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) short_process(path, i);
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        if (WIFSIGNALED(st)) killed++;
        else assert_int_equal(WEXITSTATUS(st), 0);
    }
    pool = nvh_pool_open(path, BT_LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_heap_stats h1, h2;
    assert_int_equal(nvh_heap_stats_get(pool, &h1), NVH_OK);
    t = nvh_btree_open(pool, "s", 0, NULL);
    assert_non_null(t);
    assert_int_equal(nvh_btree_check(t), NVH_OK);
    assert_int_equal(nvh_btree_reclaim(t), NVH_OK);
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    assert_int_equal(nvh_heap_stats_get(pool, &h2), NVH_OK);
    uint64_t grew = h1.live_bytes - h0.live_bytes, after = h2.live_bytes - h0.live_bytes;
    printf("  %d processes (%d killed): live bytes +%llu KiB, +%llu KiB after reclaim\n", PROCS,
           killed, (unsigned long long)(grew >> 10), (unsigned long long)(after >> 10));
    /* Records written: at most 5 puts x 64 B per process = 64 KB; killed
     * processes skip up to 4 KiB each; nodes: a few. Bound: 3 slabs of
     * records (64 + 25 x 4 = 164 KiB) + 16 KiB of nodes. One slab per
     * process would be 12.5 MiB. */
    assert_true(killed >= PROCS / 8);
    assert_true(grew <= 3 * 64 * 1024 + 16 * 1024);
    assert_true(after <= grew);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pool_close_with_tree_open),
        cmocka_unit_test(double_open),
        cmocka_unit_test(second_thread),
        cmocka_unit_test(pool_close_refused),
        cmocka_unit_test(too_long),
        cmocka_unit_test(read_only),
        cmocka_unit_test(sigkill_acknowledged),
        cmocka_unit_test(many_short_processes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
