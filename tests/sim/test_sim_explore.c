/* test_sim_explore.c — nvh_crash_explore finds crash-consistency bugs.
 *
 * The subject is a tiny persistent append-only log in the root area: entries
 * (one cache line each) and a count in a line of its own. Appending writes
 * the entry, makes it durable, then publishes it by bumping the count and
 * persisting that. Three variants:
 *   CORRECT        persist(entry); count++; persist(count)
 *   MISSING_FLUSH  entry stored, never flushed;  count++; persist(count)
 *   MISSING_FENCE  flush(entry) without drain;   count++; persist(count)
 * The checker opens each crash image and demands that every entry below the
 * count is intact and that the count covers every append the workload had
 * acknowledged (g_acked, inherited by the forked crash child).
 *
 * Also here: sampling with a budget, exhaustive counts, determinism of the
 * exploration, the report, kept images, scratch cleanup, config errors, and
 * a workload that grows the pool. */
#include "sim_test.h"

/* ---------------------------------------------------------------------------
 * The log
 * ------------------------------------------------------------------------- */
#define LOG_MAX 48
#define LOG_OPS 12
#define LAYOUT "simlog"

struct log_entry {
    uint64_t seq;             /* index + 1 */
    uint64_t value[6];
    uint64_t check;           /* ties the words together: a torn entry fails */
};

struct log_root {
    _Alignas(64) uint64_t count;                  /* alone in its cache line */
    _Alignas(64) struct log_entry entries[LOG_MAX];
};

enum variant { CORRECT, MISSING_FLUSH, MISSING_FENCE };

/* Appends the workload has acknowledged. volatile: the store must really
 * happen before the next fence, where the crash child reads it. */
static volatile uint64_t g_acked;
static int *g_complaints;   /* shared with the children: caps their messages */

static uint64_t entry_word(uint64_t i, unsigned w)
{
    return (i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)w << 56);
}

static uint64_t entry_check(const struct log_entry *e)
{
    uint64_t c = e->seq * 0xBF58476D1CE4E5B9ull;
    for (unsigned w = 0; w < 6; w++) c = (c ^ e->value[w]) * 0x94D049BB133111EBull;
    return c;
}

static int entry_ok(const struct log_entry *e, uint64_t i)
{
    if (e->seq != i + 1 || e->check != entry_check(e)) return 0;
    for (unsigned w = 0; w < 6; w++)
        if (e->value[w] != entry_word(i, w)) return 0;
    return 1;
}

/* Not static, and never inlined: crash-point backtraces must name it. It
 * returns the new count, which also keeps its final nvh_persist from being
 * compiled as a tail call (that would take its frame off the stack). */
uint64_t log_append(nvh_pool *pool, struct log_root *log, enum variant v);
__attribute__((noinline)) uint64_t log_append(nvh_pool *pool, struct log_root *log,
                                              enum variant v)
{
    uint64_t n = log->count;
    struct log_entry *e = &log->entries[n];
    e->seq = n + 1;
    for (unsigned w = 0; w < 6; w++) e->value[w] = entry_word(n, w);
    e->check = entry_check(e);
    switch (v) {
    case CORRECT: nvh_persist(pool, e, sizeof *e); break;
    case MISSING_FLUSH: break;                              /* BUG: never flushed */
    case MISSING_FENCE: nvh_flush(pool, e, sizeof *e); break; /* BUG: no drain */
    }
    log->count = n + 1;
    nvh_persist(pool, &log->count, sizeof log->count);
    return n + 1;
}

static int log_workload(nvh_pool *pool, void *arg)
{
    enum variant v = *(const enum variant *)arg;
    struct log_root *log = nvh_root(pool, NULL);
    g_acked = 0;
    for (uint64_t i = 0; i < LOG_OPS; i++)
        g_acked = log_append(pool, log, v);  /* returned: the caller was told "durable" */
    return 0;
}

static int complain(const nvh_crash_point *pt, int rc, const char *what, uint64_t a, uint64_t b)
{
    if (__atomic_fetch_add(g_complaints, 1, __ATOMIC_RELAXED) < 3)
        fprintf(stderr, "  checker: fence %llu seed %#llx: %s (%llu, %llu)\n",
                (unsigned long long)pt->fence, (unsigned long long)pt->seed, what,
                (unsigned long long)a, (unsigned long long)b);
    return rc;
}

static int log_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)arg;
    nvh_pool *pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) {
        fprintf(stderr, "  checker: cannot open %s: %s\n", image, nvh_errormsg());
        return 2;
    }
    const struct log_root *log = nvh_root(pool, NULL);
    uint64_t n = log->count;
    int rc = 0;
    if (n > LOG_MAX) rc = complain(pt, 4, "count out of range", n, LOG_MAX);
    else if (n < g_acked) rc = complain(pt, 3, "acknowledged appends lost", n, g_acked);
    else
        for (uint64_t i = 0; i < n && !rc; i++)
            if (!entry_ok(&log->entries[i], i)) rc = complain(pt, 5, "entry corrupt", i, n);
    nvh_pool_close(pool);
    return rc;
}

/* A fresh empty pool for the log (closed; explore copies it). */
static const char *log_pool(void)
{
    const char *path = test_path("log");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 1 << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return path;
}

static nvh_crash_config log_config(const char *path, enum variant *v, nvh_crash_mode mode,
                                   unsigned images, const char *scratch)
{
    *g_complaints = 0;
    return (nvh_crash_config){
        .pool_path = path, .layout = LAYOUT, .workload = log_workload, .check = log_check,
        .arg = v, .seed = 2024, .mode = mode, .images_per_point = images,
        .scratch_dir = scratch,
    };
}

static const char *g_scratch;   /* this program's scratch directory */

/* ---------------------------------------------------------------------------
 * The correct log survives every crash; the buggy ones are caught
 * ------------------------------------------------------------------------- */
static void correct_log_passes(nvh_crash_mode mode)
{
    const char *path = log_pool();
    enum variant v = CORRECT;
    nvh_crash_config cfg = log_config(path, &v, mode, 16, g_scratch);
    nvh_crash_report rep;
    assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
    if (rep.failures) nvh_crash_report_print(&rep, stderr);
    assert_int_equal(rep.failures, 0);
    assert_int_equal(rep.workload_status, 0);
    assert_int_equal(rep.fences, 2 * LOG_OPS);                  /* two persists per append */
    assert_int_equal(rep.points_tested, 16 * (rep.fences + 1)); /* every fence + final */
    assert_int_equal(sim_count_files(g_scratch, "", 0), 0);    /* copy and images gone */
    /* the pool itself was only copied */
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(((struct log_root *)nvh_root(pool, NULL))->count, 0);
    nvh_pool_close(pool);
    unlink(path);
}

static void correct_log_lines(void **state) { (void)state; correct_log_passes(NVH_CRASH_LINES); }
static void correct_log_words(void **state) { (void)state; correct_log_passes(NVH_CRASH_WORDS); }

/* A failure at a fence (not the final point) names the buggy function. */
static void assert_fence_failure(const nvh_crash_report *rep, const nvh_crash_failure *f)
{
    assert_true(f->point.fence < rep->fences);
    assert_int_not_equal(f->status, 0);
    assert_true(f->point.lines_differing > 0);
    assert_non_null(strstr(f->backtrace, "nvh_sim_drain"));
    assert_non_null(strstr(f->backtrace, "log_append"));
}

static void missing_flush_caught(void **state)
{
    (void)state;
    const char *path = log_pool();
    enum variant v = MISSING_FLUSH;
    for (int mode = NVH_CRASH_LINES; mode <= NVH_CRASH_WORDS; mode++) {
        nvh_crash_config cfg = log_config(path, &v, (nvh_crash_mode)mode, 8, g_scratch);
        nvh_crash_report rep;
        assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
        assert_int_equal(rep.fences, LOG_OPS);                    /* one persist per append */
        assert_int_equal(rep.points_tested, 8 * (LOG_OPS + 1));
        assert_true(rep.failures > 0);
        int at_fence = 0;
        for (uint64_t i = 0; i < rep.failures && i < 8; i++) {
            const nvh_crash_failure *f = &rep.first[i];
            assert_true(f->point.fence <= rep.fences);
            assert_true(f->backtrace[0] != '\0');
            if (f->point.fence < rep.fences) {
                assert_fence_failure(&rep, f);
                at_fence = 1;
            }
        }
        assert_true(at_fence);
        if (mode == NVH_CRASH_LINES) nvh_crash_report_print(&rep, stderr);
    }
    unlink(path);
}

static void missing_fence_caught(void **state)
{
    (void)state;
    const char *path = log_pool();
    enum variant v = MISSING_FENCE;
    nvh_crash_config cfg = log_config(path, &v, NVH_CRASH_LINES, 16, g_scratch);
    nvh_crash_report rep, again;
    assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
    assert_int_equal(rep.fences, LOG_OPS);
    assert_true(rep.failures > 0);
    for (uint64_t i = 0; i < rep.failures && i < 8; i++) {
        const nvh_crash_failure *f = &rep.first[i];
        assert_fence_failure(&rep, f);
        /* the window is the publishing fence itself: entry and count both in
         * flight, the count's write-back won; nothing acknowledged is lost */
        assert_int_equal(f->status, 5);
        assert_int_equal(f->point.lines_differing, 2);       /* entry and count */
    }
    /* word mode finds it too */
    cfg.mode = NVH_CRASH_WORDS;
    assert_int_equal(nvh_crash_explore(&cfg, &again), NVH_OK);
    assert_true(again.failures > 0);

    /* deterministic: the same seed gives the same findings */
    cfg.mode = NVH_CRASH_LINES;
    assert_int_equal(nvh_crash_explore(&cfg, &again), NVH_OK);
    assert_int_equal(again.failures, rep.failures);
    for (uint64_t i = 0; i < rep.failures && i < 8; i++) {
        assert_int_equal(again.first[i].point.fence, rep.first[i].point.fence);
        assert_int_equal(again.first[i].point.seed, rep.first[i].point.seed);
        assert_int_equal(again.first[i].point.lines_differing,
                         rep.first[i].point.lines_differing);
        assert_int_equal(again.first[i].status, rep.first[i].status);
    }

    /* the printed report carries fence, seed, status and the backtrace */
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    assert_non_null(mem);
    nvh_crash_report_print(&rep, mem);
    fclose(mem);
    char expect[128];
    snprintf(expect, sizeof expect, "failure 1: fence %llu", (unsigned long long)rep.first[0].point.fence);
    assert_non_null(strstr(text, expect));
    snprintf(expect, sizeof expect, "seed %#llx", (unsigned long long)rep.first[0].point.seed);
    assert_non_null(strstr(text, expect));
    assert_non_null(strstr(text, "status 5"));
    assert_non_null(strstr(text, "log_append"));
    snprintf(expect, sizeof expect, "%llu failed", (unsigned long long)rep.failures);
    assert_non_null(strstr(text, expect));
    fputs(text, stderr);
    free(text);
    unlink(path);
}

/* keep_failed_images keeps exactly the failing images, and they are real
 * crash images: re-checking one fails again. */
static void failed_images_kept(void **state)
{
    (void)state;
    const char *path = log_pool();
    enum variant v = MISSING_FENCE;
    const char *dir = sim_scratch_dir("kept");
    nvh_crash_config cfg = log_config(path, &v, NVH_CRASH_LINES, 4, dir);
    cfg.keep_failed_images = 1;
    nvh_crash_report rep;
    assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
    assert_true(rep.failures > 0);
    assert_int_equal(sim_count_files(dir, ".img", 0), (int)rep.failures);
    assert_int_equal(sim_count_files(dir, "", 0), (int)rep.failures);   /* no copy left */
    sim_count_files(dir, "", 1);
    rmdir(dir);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Which points are tested: exhaustive, sampled, images per point
 * ------------------------------------------------------------------------- */
#define COUNTER_FENCES 200

struct point_log {
    uint64_t n;
    nvh_crash_point pts[2048];
};
static struct point_log *g_points;   /* shared with the children */

static int counter_workload(nvh_pool *pool, void *arg)
{
    uint64_t fences = arg ? *(const uint64_t *)arg : COUNTER_FENCES;
    uint64_t *c = nvh_root(pool, NULL);
    for (uint64_t i = 0; i < fences; i++) {
        *c = i + 1;
        nvh_persist(pool, c, sizeof *c);
    }
    return 0;
}

/* Records the point (children run one at a time, so no race). */
static int record_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)image; (void)arg;
    if (g_points->n < sizeof g_points->pts / sizeof g_points->pts[0])
        g_points->pts[g_points->n++] = *pt;
    return 0;
}

static nvh_crash_report explore_points(const char *path, uint64_t budget, uint64_t seed,
                                       unsigned images, uint64_t *fences)
{
    nvh_crash_config cfg = {
        .pool_path = path, .workload = counter_workload, .check = record_check, .arg = fences,
        .seed = seed, .budget = budget, .images_per_point = images, .scratch_dir = g_scratch,
    };
    nvh_crash_report rep;
    memset(g_points, 0, sizeof *g_points);
    assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
    assert_int_equal(rep.failures, 0);
    assert_int_equal(rep.points_tested, g_points->n);
    return rep;
}

static const char *counter_pool(void)
{
    const char *path = test_path("counter");
    nvh_pool *pool = nvh_pool_create(path, NULL, 1 << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return path;
}

static void exhaustive_points(void **state)
{
    (void)state;
    const char *path = counter_pool();
    nvh_crash_report rep = explore_points(path, 0, 5, 1, NULL);
    assert_int_equal(rep.fences, COUNTER_FENCES);
    assert_int_equal(rep.points_tested, COUNTER_FENCES + 1);
    for (uint64_t i = 0; i <= COUNTER_FENCES; i++) {
        assert_int_equal(g_points->pts[i].fence, i);
        /* the fence count is only known at the final point in a single run */
        assert_int_equal(g_points->pts[i].fence_count, i == COUNTER_FENCES ? COUNTER_FENCES : 0);
        /* in flight: the counter's line at every fence; nothing at the final
         * point, where every fence has passed */
        assert_int_equal(g_points->pts[i].lines_differing, i < COUNTER_FENCES);
    }

    /* images_per_point: that many distinct images at every point */
    uint64_t fences = 10;
    rep = explore_points(path, 0, 5, 3, &fences);
    assert_int_equal(rep.fences, 10);
    assert_int_equal(rep.points_tested, 3 * 11);
    for (uint64_t i = 0; i < 33; i += 3) {
        assert_int_equal(g_points->pts[i].fence, i / 3);
        assert_int_equal(g_points->pts[i + 2].fence, i / 3);
        assert_int_not_equal(g_points->pts[i].seed, g_points->pts[i + 1].seed);
        assert_int_not_equal(g_points->pts[i + 1].seed, g_points->pts[i + 2].seed);
    }
    unlink(path);
}

static void sampled_points(void **state)
{
    (void)state;
    const char *path = counter_pool();
    nvh_crash_report rep = explore_points(path, 20, 7, 1, NULL);
    assert_int_equal(rep.fences, COUNTER_FENCES);
    assert_int_equal(rep.points_tested, 20);
    nvh_crash_point first[20];
    memcpy(first, g_points->pts, sizeof first);
    for (int i = 0; i < 20; i++) {
        assert_true(first[i].fence <= COUNTER_FENCES);
        assert_int_equal(first[i].fence_count, COUNTER_FENCES);
        if (i) assert_true(first[i].fence > first[i - 1].fence);   /* distinct, in order */
    }
    /* same seed: same points, same image seeds */
    rep = explore_points(path, 20, 7, 1, NULL);
    assert_int_equal(rep.points_tested, 20);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(g_points->pts[i].fence, first[i].fence);
        assert_int_equal(g_points->pts[i].seed, first[i].seed);
    }
    /* another seed: another sample */
    rep = explore_points(path, 20, 8, 1, NULL);
    assert_int_equal(rep.points_tested, 20);
    int same = 1;
    for (int i = 0; i < 20; i++) same &= g_points->pts[i].fence == first[i].fence;
    assert_false(same);
    /* a budget covering every point tests each exactly once */
    rep = explore_points(path, 1000, 7, 1, NULL);
    assert_int_equal(rep.points_tested, COUNTER_FENCES + 1);
    for (uint64_t i = 0; i <= COUNTER_FENCES; i++) assert_int_equal(g_points->pts[i].fence, i);
    /* budget 1 with 2 points: the sample spreads (both points get picked
     * across seeds) */
    uint64_t one = 1, seen[2] = {0, 0};
    for (uint64_t seed = 1; seed <= 16; seed++) {
        rep = explore_points(path, 1, seed, 1, &one);
        assert_int_equal(rep.points_tested, 1);
        seen[g_points->pts[0].fence]++;
    }
    assert_true(seen[0] > 0 && seen[1] > 0);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * A workload that grows the pool: images stay valid pools
 * ------------------------------------------------------------------------- */
#define TAIL_LEN 200

struct grow_root {
    uint64_t tail_off[2];       /* published offsets of the tails: single words */
};

static uint64_t *g_max_size;    /* shared: largest pool size a checker saw */

static int grow_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    struct grow_root *r = nvh_root(pool, NULL);
    for (int t = 0; t < 2; t++) {
        uint64_t size = (uint64_t)(4 << t) << 20;          /* 4 MiB, then 8 MiB */
        if (nvh_pool_grow(pool, size) != NVH_OK) return 1;
        uint64_t off = size - (1 << 20);
        char *tail = (char *)nvh_pool_base(pool) + off;
        for (int i = 0; i < TAIL_LEN; i++) tail[i] = (char)(i + t + 1);
        nvh_persist(pool, tail, TAIL_LEN);
        r->tail_off[t] = off;
        nvh_persist(pool, &r->tail_off[t], sizeof r->tail_off[t]);
    }
    return 0;
}

static int grow_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)arg; (void)pt;
    nvh_pool *pool = nvh_pool_open(image, "grow", NVH_DOMAIN_PROCESS);
    if (!pool) {
        fprintf(stderr, "  grow checker: %s\n", nvh_errormsg());
        return 2;
    }
    const struct grow_root *r = nvh_root(pool, NULL);
    uint64_t size = nvh_pool_size(pool);
    if (size > *g_max_size) *g_max_size = size;
    int rc = 0;
    for (int t = 0; t < 2 && !rc; t++) {
        uint64_t off = r->tail_off[t];
        if (!off) continue;
        if (off + TAIL_LEN > size) {
            rc = 3;
            break;
        }
        const char *tail = (const char *)nvh_pool_base(pool) + off;
        for (int i = 0; i < TAIL_LEN; i++)
            if (tail[i] != (char)(i + t + 1)) rc = 4;
    }
    nvh_pool_close(pool);
    return rc;
}

static void grow_during_workload(void **state)
{
    (void)state;
    const char *path = test_path("grow");
    nvh_pool *pool = nvh_pool_create(path, "grow", 1 << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    for (int mode = NVH_CRASH_LINES; mode <= NVH_CRASH_WORDS; mode++) {
        *g_max_size = 0;
        nvh_crash_config cfg = {
            .pool_path = path, .layout = "grow", .workload = grow_workload, .check = grow_check,
            .seed = 99, .mode = (nvh_crash_mode)mode, .images_per_point = 8,
            .scratch_dir = g_scratch,
        };
        nvh_crash_report rep;
        assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
        if (rep.failures) nvh_crash_report_print(&rep, stderr);
        assert_int_equal(rep.workload_status, 0);
        assert_int_equal(rep.failures, 0);
        assert_int_equal(rep.fences, 6);         /* per tail: grow, data, publish */
        assert_int_equal(*g_max_size, 8 << 20);
    }
    /* the original is untouched: still 1 MiB */
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 1 << 20);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------- */
static void bad_configs(void **state)
{
    (void)state;
    const char *path = log_pool();
    enum variant v = CORRECT;
    nvh_crash_report rep;
    nvh_crash_config cfg = log_config(path, &v, NVH_CRASH_LINES, 1, g_scratch);

    assert_int_equal(nvh_crash_explore(NULL, &rep), NVH_E_INVAL);
    assert_int_equal(nvh_crash_explore(&cfg, NULL), NVH_E_INVAL);
    nvh_crash_config c = cfg;
    c.workload = NULL;
    assert_int_equal(nvh_crash_explore(&c, &rep), NVH_E_INVAL);
    assert_non_null(strstr(nvh_errormsg(), "workload"));
    c = cfg;
    c.check = NULL;
    assert_int_equal(nvh_crash_explore(&c, &rep), NVH_E_INVAL);
    c = cfg;
    c.pool_path = NULL;
    assert_int_equal(nvh_crash_explore(&c, &rep), NVH_E_INVAL);
    c = cfg;
    c.mode = (nvh_crash_mode)7;
    assert_int_equal(nvh_crash_explore(&c, &rep), NVH_E_INVAL);

    c = cfg;
    c.pool_path = test_path("no-such-pool");
    assert_int_equal(nvh_crash_explore(&c, &rep), NVH_E_NOENT);
    assert_non_null(strstr(nvh_errormsg(), "no-such-pool"));
    c = cfg;
    c.scratch_dir = "/nonexistent/scratch";
    assert_int_equal(nvh_crash_explore(&c, &rep), NVH_E_IO);
    assert_non_null(strstr(nvh_errormsg(), "/nonexistent/scratch"));
    c = cfg;
    c.layout = "another";
    assert_int_equal(nvh_crash_explore(&c, &rep), NVH_E_LAYOUT);
    assert_non_null(strstr(nvh_errormsg(), "sim-domain copy"));
    c = cfg;
    c.budget = 3;
    c.layout = "another";
    assert_int_equal(nvh_crash_explore(&c, &rep), NVH_E_LAYOUT);   /* counting run too */
    assert_int_equal(sim_count_files(g_scratch, "", 0), 0);
    unlink(path);
}

int main(void)
{
    g_complaints = sim_shared_alloc(sizeof *g_complaints);
    g_points = sim_shared_alloc(sizeof *g_points);
    g_max_size = sim_shared_alloc(sizeof *g_max_size);
    g_scratch = sim_scratch_dir("explore");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(correct_log_lines),
        cmocka_unit_test(correct_log_words),
        cmocka_unit_test(missing_flush_caught),
        cmocka_unit_test(missing_fence_caught),
        cmocka_unit_test(failed_images_kept),
        cmocka_unit_test(exhaustive_points),
        cmocka_unit_test(sampled_points),
        cmocka_unit_test(grow_during_workload),
        cmocka_unit_test(bad_configs),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(g_scratch);      /* fails (and so stays visible) if anything was left */
    return failed;
}
