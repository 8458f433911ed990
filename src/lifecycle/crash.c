/* crash.c — nvh_crash_explore(): the crash-exploration harness on top of the
 * sim domain's media model (src/persist/sim.c). It lives in the open/close
 * sequence's layer because it opens and closes pools (with heap and
 * transaction recovery) on its scratch copies.
 *
 * One exploration:
 *   1. (sampling only) a counting run: the workload runs once on a scratch
 *      copy of the pool to learn how many fences F it executes; then `budget`
 *      distinct crash points are drawn from 0..F with a PRNG seeded by the
 *      config, so the same seed always tests the same points;
 *   2. the crash run: a fresh scratch copy is opened in the sim domain, a fence
 *      hook is installed and the workload runs. At every chosen fence the hook
 *      forks; the child writes a crash image (media + seeded choices for the
 *      lines in flight), runs the user's checker on it and _exits with the
 *      verdict. The parent waits — still inside the hook, i.e. still standing
 *      on the crash point's stack — and on a failure records the fence, the
 *      seed and that stack's backtrace. Point F (after the workload returned,
 *      before close) is tested the same way without a hook.
 *
 * Why fork: the child is a perfect snapshot of the process at the crash point
 * — the checker sees what the workload had acknowledged so far in ordinary
 * variables — and nothing it does (crashing, leaking, scribbling) can harm the
 * parent or the following crash points. Children run one at a time, so
 * failures are reported in fence order and the output is deterministic.
 *
 * The checker's exact return value and the image's degrees of freedom travel
 * back through a small MAP_SHARED page, not the 8-bit exit status.
 */
#include "../common/internal.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define FAILURES_KEPT (sizeof(((nvh_crash_report *)0)->first) / \
                       sizeof(((nvh_crash_report *)0)->first[0]))
#define BACKTRACE_DEPTH 64
#define COPY_CHUNK ((size_t)1 << 20)
#define CHILD_EXIT_HARNESS 125        /* child could not even build the image */
#define ERRMSG_MAX 512

/* --------------------------------------------------------------------------
 * State shared with the crash child (one MAP_SHARED page per exploration)
 * -------------------------------------------------------------------------- */
enum child_state {
    CHILD_STARTED = 0,     /* forked, building the image                      */
    CHILD_IMAGE_FAILED,    /* could not write the image: a harness error      */
    CHILD_CHECKING,        /* image written, checker running                  */
    CHILD_CHECKED,         /* checker returned; rc holds its value            */
};

typedef struct child_result {
    int state;             /* enum child_state                                */
    int rc;                /* the checker's return value                      */
    uint64_t differing;    /* lines in flight in the image                    */
    char msg[ERRMSG_MAX];  /* why the image could not be written              */
} child_result;

/* --------------------------------------------------------------------------
 * The exploration's state (lives on nvh_crash_explore's stack; the fence
 * hook gets a pointer to it)
 * -------------------------------------------------------------------------- */
typedef struct explore {
    const nvh_crash_config *cfg;
    nvh_crash_report *report;
    const char *dir;             /* scratch directory                          */
    uint64_t seed;               /* cfg->seed, 0 mapped to 1                   */
    unsigned images;             /* images per crash point                     */
    int verbose;                 /* NVHEAP_CRASH_VERBOSE                       */

    uint64_t base_fence;         /* pool fences before the workload started    */
    uint64_t counted;            /* fences of the counting run (sampling)      */
    const uint64_t *chosen;      /* sorted points to test; NULL = all of them  */
    size_t chosen_count, chosen_next;

    bool at_final;               /* testing point F (no fence on the stack)    */
    void *stack_top;             /* first frame worth showing in a backtrace:
                                    the return address into nvh_sim_drain (at a
                                    fence) or into the explorer's caller (at F) */
    void *caller;                /* return address into nvh_crash_explore's
                                    caller: the last frame shown              */
    child_result *result;        /* shared with the child                      */
    char copy_path[PATH_MAX];
    char image_path[PATH_MAX + 64];

    int error;                   /* first harness error (stops exploring)      */
    char errmsg[ERRMSG_MAX];
} explore;

/* --------------------------------------------------------------------------
 * Deterministic randomness (nvh_splitmix64, common/internal.h)
 * -------------------------------------------------------------------------- */
/* The seed of image `image` at fence `fence`: a pure function of the three,
 * so any reported failure can be rebuilt with nvh_sim_write_image(seed). */
static inline uint64_t image_seed(uint64_t base, uint64_t fence, unsigned image)
{
    uint64_t s = nvh_mix64(base + 0x9E3779B97F4A7C15ull * (fence + 1));
    return nvh_mix64(s ^ (0xD1B54A32D192ED03ull * ((uint64_t)image + 1)));
}

/* Knuth's selection sampling (TAOCP vol. 2, 3.4.2, Algorithm S): one pass
 * over 0..total-1 picks exactly n of them, every n-subset equally likely, and
 * yields them sorted — the order in which the fences will arrive. */
static uint64_t *choose_points(uint64_t n, uint64_t total, uint64_t seed)
{
    uint64_t *out = malloc((size_t)n * sizeof *out);
    if (!out) return NULL;
    uint64_t rng = seed, m = 0;
    for (uint64_t t = 0; t < total && m < n; t++) {
        double u = (double)(nvh_splitmix64(&rng) >> 11) * 0x1.0p-53;   /* [0, 1) */
        if ((double)(total - t) * u < (double)(n - m)) out[m++] = t;
    }
    return out;
}

/* --------------------------------------------------------------------------
 * Small helpers
 * -------------------------------------------------------------------------- */
static void harness_error(explore *ex, int code, int errno_value, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Remember the first harness error; the hook goes quiet after it (it cannot
 * abort the workload), and nvh_crash_explore returns it at the end. */
static void harness_error(explore *ex, int code, int errno_value, const char *fmt, ...)
{
    if (ex->error) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(ex->errmsg, sizeof ex->errmsg, fmt, ap);
    va_end(ap);
    if (errno_value && n >= 0 && (size_t)n < sizeof ex->errmsg)
        snprintf(ex->errmsg + n, sizeof ex->errmsg - (size_t)n, ": %s", strerror(errno_value));
    ex->error = code;
}

static inline bool all_zero(const unsigned char *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i]) return false;
    return true;
}

static const char *scratch_dir(const nvh_crash_config *cfg)
{
    if (cfg->scratch_dir && *cfg->scratch_dir) return cfg->scratch_dir;
    const char *env = getenv("NVHEAP_SCRATCH");
    if (env && *env) return env;
    return "/dev/shm";
}

/* Copy the pool to a new scratch file (ex->copy_path). Zero chunks are left
 * as holes: pools are mostly unused heap, and a sparse copy on tmpfs is cheap. */
static int copy_pool(explore *ex)
{
    const char *src = ex->cfg->pool_path;
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return nvh_fail_errno(errno == ENOENT ? NVH_E_NOENT : NVH_E_IO, errno,
                              "nvh_crash_explore: cannot open pool %s", src);
    int n = snprintf(ex->copy_path, sizeof ex->copy_path, "%s/nvh-crash-XXXXXX", ex->dir);
    if (n < 0 || (size_t)n >= sizeof ex->copy_path) {
        close(in);
        return nvh_fail(NVH_E_TOOLONG, "nvh_crash_explore: scratch directory name too long: %s",
                        ex->dir);
    }
    int out = mkostemp(ex->copy_path, O_CLOEXEC);
    if (out < 0) {
        int e = errno;
        close(in);
        ex->copy_path[0] = '\0';
        return nvh_fail_errno(NVH_E_IO, e, "nvh_crash_explore: cannot create a scratch copy "
                              "in %s (set scratch_dir or NVHEAP_SCRATCH)", ex->dir);
    }
    int rc = NVH_OK;
    unsigned char *buf = malloc(COPY_CHUNK);
    struct stat st;
    if (!buf) {
        rc = nvh_fail(NVH_E_NOMEM, "nvh_crash_explore: out of memory copying %s", src);
    } else if (fstat(in, &st) != 0 || ftruncate(out, st.st_size) != 0) {
        rc = nvh_fail_errno(NVH_E_IO, errno, "nvh_crash_explore: cannot size the copy %s of %s",
                            ex->copy_path, src);
    } else {
        off_t off = 0;
        for (;;) {
            ssize_t got = read(in, buf, COPY_CHUNK);
            if (got < 0 && errno == EINTR) continue;
            if (got < 0) {
                rc = nvh_fail_errno(NVH_E_IO, errno, "nvh_crash_explore: cannot read %s", src);
                break;
            }
            if (got == 0) break;
            if (!all_zero(buf, (size_t)got)) {
                for (ssize_t done = 0; done < got;) {
                    ssize_t w = pwrite(out, buf + done, (size_t)(got - done), off + done);
                    if (w < 0 && errno == EINTR) continue;
                    if (w <= 0) {
                        rc = nvh_fail_errno(NVH_E_IO, errno, "nvh_crash_explore: cannot write "
                                            "the copy %s", ex->copy_path);
                        break;
                    }
                    done += w;
                }
                if (rc != NVH_OK) break;
            }
            off += got;
        }
    }
    free(buf);
    close(in);
    if (close(out) != 0 && rc == NVH_OK)
        rc = nvh_fail_errno(NVH_E_IO, errno, "nvh_crash_explore: cannot write the copy %s",
                            ex->copy_path);
    if (rc != NVH_OK) {
        unlink(ex->copy_path);
        ex->copy_path[0] = '\0';
    }
    return rc;
}

/* --------------------------------------------------------------------------
 * Backtraces
 * -------------------------------------------------------------------------- */
/* Symbolise the current stack from ex->stack_top to ex->caller into
 * out[len]. The frames inside it are the harness's own (hook, fork, wait) and
 * those outside the test runner's: noise for a user looking for the store
 * that was not persisted, and room taken from the 2 KiB a report keeps. */
static void crash_backtrace(const explore *ex, char *out, size_t len)
{
    void *frames[BACKTRACE_DEPTH];
    int n = backtrace(frames, BACKTRACE_DEPTH);
    int first = 0;
    for (int i = 0; i < n; i++) {
        if (frames[i] == ex->stack_top) {
            first = i;
            break;
        }
    }
    for (int i = first; i < n; i++) {
        if (frames[i] == ex->caller) {
            n = i + 1;
            break;
        }
    }
    size_t used = 0;
    out[0] = '\0';
    if (ex->at_final)
        used += (size_t)snprintf(out, len, "  (final point: the workload had returned; "
                                 "stack of the nvh_crash_explore call)\n");
    char **names = backtrace_symbols(frames + first, n - first);
    for (int i = 0; i < n - first && used < len; i++) {
        int w;
        if (names) w = snprintf(out + used, len - used, "  #%d %s\n", i, names[i]);
        else w = snprintf(out + used, len - used, "  #%d %p\n", i, frames[first + i]);
        if (w < 0) break;
        used += (size_t)w;
    }
    free(names);
    if (used >= len && len > 5) memcpy(out + len - 5, "...\n", 5);   /* mark the cut */
}

/* --------------------------------------------------------------------------
 * The crash child
 * -------------------------------------------------------------------------- */
static char child_crash_msg[PATH_MAX + 256];   /* names the image: sized for it */

/* A checker that crashes gets its own stack printed before it dies, so the
 * report's "status 134" comes with a clue. Only async-signal-safe calls:
 * write(2) and backtrace_symbols_fd (backtrace() was primed in the parent, so
 * libgcc is already loaded and nothing here allocates). */
static void child_crash_handler(int sig)
{
    size_t len = strlen(child_crash_msg);
    if (write(STDERR_FILENO, child_crash_msg, len) < 0) { /* nothing to do */ }
    void *frames[BACKTRACE_DEPTH];
    int n = backtrace(frames, BACKTRACE_DEPTH);
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
    signal(sig, SIG_DFL);   /* SA_RESETHAND did this already; be explicit */
    raise(sig);             /* die of the same signal: the parent sees 128+sig */
}

/* The test framework around the parent (cmocka, say) may have handlers that
 * longjmp back into its test runner: in the child that would resume the test
 * suite inside the crash child. Replace them all. */
static void child_install_handlers(void)
{
    static const int crash_signals[] = {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE, SIGTRAP,
                                        SIGSYS};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = child_crash_handler;
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigset_t unblock;
    sigemptyset(&unblock);
    for (size_t i = 0; i < sizeof crash_signals / sizeof crash_signals[0]; i++) {
        sigaction(crash_signals[i], &sa, NULL);
        sigaddset(&unblock, crash_signals[i]);
    }
    sigprocmask(SIG_UNBLOCK, &unblock, NULL);
}

/* Runs in the forked child: build the image, check it, report, _exit. Never
 * returns — returning would continue the parent's workload in the child — and
 * never calls exit(), which would run the parent's atexit handlers (test
 * frameworks, sanitizers' leak checks) a second time. */
static _Noreturn void child_main(explore *ex, nvh_pool *pool, nvh_crash_point *point)
{
    const nvh_crash_config *cfg = ex->cfg;
    child_result *res = ex->result;
    child_install_handlers();
    snprintf(child_crash_msg, sizeof child_crash_msg,
             "nvh_crash_explore: the checker crashed on image %s (fence %llu, seed %#llx); "
             "its stack:\n", ex->image_path, (unsigned long long)point->fence,
             (unsigned long long)point->seed);

    uint64_t differing = 0;
    if (nvh_sim_image_(pool, ex->image_path, point->seed, cfg->mode, &differing) != NVH_OK) {
        snprintf(res->msg, sizeof res->msg, "%s", nvh_errormsg());
        res->state = CHILD_IMAGE_FAILED;
        unlink(ex->image_path);
        _exit(CHILD_EXIT_HARNESS);
    }
    point->lines_differing = differing;
    res->differing = differing;
    res->state = CHILD_CHECKING;

    int rc = cfg->check(ex->image_path, point, cfg->arg);

    res->rc = rc;
    res->state = CHILD_CHECKED;
    if (rc == 0 || !cfg->keep_failed_images) unlink(ex->image_path);
    fflush(NULL);                       /* _exit does not flush stdio */
    _exit(rc == 0 ? 0 : (rc & 0xFF) ? (rc & 0xFF) : 1);
}

/* --------------------------------------------------------------------------
 * One crash image: fork, wait, judge (parent side)
 * -------------------------------------------------------------------------- */
static void record_failure(explore *ex, const nvh_crash_point *point, int status)
{
    nvh_crash_report *r = ex->report;
    if (r->failures < FAILURES_KEPT) {
        nvh_crash_failure *f = &r->first[r->failures];
        f->point = *point;
        f->status = status;
        crash_backtrace(ex, f->backtrace, sizeof f->backtrace);
    }
    r->failures++;
    if (ex->cfg->keep_failed_images)
        fprintf(stderr, "nvh_crash_explore: kept failing image %s (fence %llu, seed %#llx, "
                "status %d)\n", ex->image_path, (unsigned long long)point->fence,
                (unsigned long long)point->seed, status);
}

static void test_image(explore *ex, nvh_pool *pool, uint64_t fence, uint64_t fence_count,
                       unsigned image)
{
    nvh_crash_point point = {
        .fence = fence,
        .fence_count = fence_count,
        .seed = image_seed(ex->seed, fence, image),
    };
    snprintf(ex->image_path, sizeof ex->image_path, "%s.f%llu.i%u.img", ex->copy_path,
             (unsigned long long)fence, image);
    memset(ex->result, 0, sizeof *ex->result);

    fflush(NULL);            /* or buffered output would be printed twice */
    pid_t pid = fork();
    if (pid < 0) {
        harness_error(ex, errno == ENOMEM || errno == EAGAIN ? NVH_E_NOMEM : NVH_E_IO, errno,
                      "nvh_crash_explore: cannot fork a crash child at fence %llu",
                      (unsigned long long)fence);
        return;
    }
    if (pid == 0) child_main(ex, pool, &point);

    int wstatus;
    while (waitpid(pid, &wstatus, 0) < 0) {
        if (errno != EINTR) {
            harness_error(ex, NVH_E_IO, errno, "nvh_crash_explore: cannot wait for the crash "
                          "child at fence %llu", (unsigned long long)fence);
            return;
        }
    }
    const child_result *res = ex->result;
    if (res->state == CHILD_IMAGE_FAILED) {
        harness_error(ex, NVH_E_IO, 0, "nvh_crash_explore: cannot build the crash image at "
                      "fence %llu: %s", (unsigned long long)fence, res->msg);
        return;
    }
    point.lines_differing = res->differing;

    int status;
    if (WIFSIGNALED(wstatus)) status = 128 + WTERMSIG(wstatus);
    else if (res->state == CHILD_CHECKED) status = res->rc;
    else status = WEXITSTATUS(wstatus);       /* the checker called exit() itself */

    ex->report->points_tested++;
    if (status != 0) record_failure(ex, &point, status);
    /* A child that died inside the checker could not clean up after itself. */
    if (res->state != CHILD_CHECKED && (status == 0 || !ex->cfg->keep_failed_images))
        unlink(ex->image_path);

    if (ex->verbose)
        fprintf(stderr, "nvh_crash_explore: fence %llu%s image %u seed %#llx: %llu lines in "
                "flight: %s (status %d)\n", (unsigned long long)fence,
                ex->at_final ? " (final)" : "", image, (unsigned long long)point.seed,
                (unsigned long long)point.lines_differing, status ? "FAILED" : "ok", status);
}

static void test_point(explore *ex, nvh_pool *pool, uint64_t fence, uint64_t fence_count)
{
    for (unsigned i = 0; i < ex->images && !ex->error; i++)
        test_image(ex, pool, fence, fence_count, i);
}

/* --------------------------------------------------------------------------
 * The fence hook (parent side, called by nvh_sim_drain before the fence)
 * -------------------------------------------------------------------------- */
__attribute__((noinline))
static void fence_hook(nvh_pool *pool, uint64_t fence, void *arg)
{
    explore *ex = arg;
    /* The address this hook returns to inside nvh_sim_drain: the frame where
     * a crash point's backtrace starts. Taken here, where it is exact, rather
     * than guessed from how many harness frames the compiler kept. */
    ex->stack_top = __builtin_return_address(0);
    uint64_t k = fence - ex->base_fence;
    if (ex->error) return;
    if (ex->chosen) {
        /* fences arrive in order and chosen[] is sorted */
        if (ex->chosen_next >= ex->chosen_count || ex->chosen[ex->chosen_next] != k) return;
        ex->chosen_next++;
    }
    test_point(ex, pool, k, ex->counted);
}

/* --------------------------------------------------------------------------
 * One run of the workload on a fresh scratch copy
 * -------------------------------------------------------------------------- */
/* crash == false: the counting run (no hook, no children). Returns NVH_OK or
 * the error that kept the run from starting; *fences_out gets the workload's
 * fence count. */
static int run_workload(explore *ex, bool crash, uint64_t *fences_out)
{
    const nvh_crash_config *cfg = ex->cfg;
    int rc = copy_pool(ex);
    if (rc != NVH_OK) return rc;
    nvh_pool *pool = nvh_pool_open(ex->copy_path, cfg->layout, NVH_DOMAIN_SIM);
    if (!pool) {
        nvh_err_saved err;
        nvh_err_save(&err);
        unlink(ex->copy_path);
        nvh_err_restore(&err);
        return nvh_fail_context(err.code, "nvh_crash_explore: cannot open a sim-domain copy of %s",
                                cfg->pool_path);
    }
    /* open itself fenced (the epoch update): the workload's fences count from here */
    ex->base_fence = nvh_sim_fence_count(pool);
    if (crash) nvh_sim_set_fence_hook(pool, fence_hook, ex);

    int status = cfg->workload(pool, cfg->arg);

    uint64_t fences = nvh_sim_fence_count(pool) - ex->base_fence;
    *fences_out = fences;
    if (crash) {
        nvh_sim_set_fence_hook(pool, NULL, NULL);   /* close fences too: not a crash point */
        ex->report->workload_status = status;
        ex->report->fences = fences;
        bool final = !ex->chosen ||
                     (ex->chosen_next < ex->chosen_count &&
                      ex->chosen[ex->chosen_count - 1] == ex->counted);
        if (final && !ex->error) {
            ex->at_final = true;
            ex->stack_top = ex->caller;
            test_point(ex, pool, fences, fences);
            ex->at_final = false;
        }
    }
    nvh_pool_close(pool);        /* a write-back of a file about to be deleted */
    unlink(ex->copy_path);
    ex->copy_path[0] = '\0';
    return NVH_OK;
}

/* --------------------------------------------------------------------------
 * Public entry points
 * -------------------------------------------------------------------------- */
int nvh_crash_explore(const nvh_crash_config *config, nvh_crash_report *report)
{
    if (!config || !report)
        return nvh_fail(NVH_E_INVAL, "nvh_crash_explore: NULL %s", config ? "report" : "config");
    if (!config->pool_path || !config->workload || !config->check)
        return nvh_fail(NVH_E_INVAL, "nvh_crash_explore: the config needs pool_path, workload "
                        "and check (missing %s)", !config->pool_path ? "pool_path"
                        : !config->workload ? "workload" : "check");
    if (config->mode != NVH_CRASH_LINES && config->mode != NVH_CRASH_WORDS)
        return nvh_fail(NVH_E_INVAL, "nvh_crash_explore: unknown crash mode %d",
                        (int)config->mode);
    memset(report, 0, sizeof *report);

    /* Where the caller's frames start: the final point's backtrace begins here. */
    void *caller = __builtin_return_address(0);
    const char *verbose = getenv("NVHEAP_CRASH_VERBOSE");
    explore ex = {
        .cfg = config,
        .report = report,
        .dir = scratch_dir(config),
        .seed = config->seed ? config->seed : 1,
        .images = config->images_per_point ? config->images_per_point : 1,
        .verbose = verbose && atoi(verbose) > 0,
        .caller = caller,
    };
    ex.result = mmap(NULL, sizeof *ex.result, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ex.result == MAP_FAILED)
        return nvh_fail_errno(NVH_E_NOMEM, errno, "nvh_crash_explore: cannot map a page "
                              "shared with the crash children");

    /* backtrace() loads libgcc on first use (which allocates): do it now,
     * not first in a crash child's signal handler. */
    void *prime[1];
    backtrace(prime, 1);

    /* A SIGCHLD handler that reaps, or SIG_IGN (auto-reap), would steal the
     * children's exit statuses from waitpid. */
    struct sigaction dfl, old_chld;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGCHLD, &dfl, &old_chld);

    int rc = NVH_OK;
    uint64_t *chosen = NULL;
    uint64_t fences = 0;
    if (config->budget > 0) {
        rc = run_workload(&ex, false, &fences);
        ex.counted = fences;
        if (rc == NVH_OK && config->budget < fences + 1) {
            chosen = choose_points(config->budget, fences + 1, nvh_mix64(ex.seed ^ 0x5A4D504C45ull));
            if (!chosen)
                rc = nvh_fail(NVH_E_NOMEM, "nvh_crash_explore: out of memory for %llu "
                              "crash points", (unsigned long long)config->budget);
            ex.chosen = chosen;
            ex.chosen_count = (size_t)config->budget;
        }
    }
    if (rc == NVH_OK) {
        if (ex.verbose)
            fprintf(stderr, "nvh_crash_explore: %s, %u image(s) per point, seed %#llx, "
                    "scratch %s\n", chosen ? "sampling" : "every fence", ex.images,
                    (unsigned long long)ex.seed, ex.dir);
        rc = run_workload(&ex, true, &fences);
    }
    if (rc == NVH_OK && config->budget > 0 && fences != ex.counted)
        fprintf(stderr, "nvh_crash_explore: warning: the workload is not deterministic: "
                "%llu fences in the counting run, %llu in the crash run\n",
                (unsigned long long)ex.counted, (unsigned long long)fences);

    sigaction(SIGCHLD, &old_chld, NULL);
    free(chosen);
    munmap(ex.result, sizeof *ex.result);
    if (rc == NVH_OK && ex.error) rc = nvh_fail(ex.error, "%s", ex.errmsg);
    if (ex.verbose && rc == NVH_OK)
        nvh_crash_report_print(report, stderr);
    return rc;
}

/* "134" alone sends readers to a signal table: name the signal. */
static void describe_status(int status, char *out, size_t len)
{
    if (status > 128 && status < 128 + 65)
        snprintf(out, len, " (the child died of signal %d: %s)", status - 128,
                 strsignal(status - 128));
    else
        snprintf(out, len, " (the checker returned %d)", status);
}

void nvh_crash_report_print(const nvh_crash_report *report, void *file)
{
    FILE *f = file ? file : stderr;
    if (!report) return;
    fprintf(f, "crash exploration: %llu fences, %llu crash images checked, %llu failed "
            "(workload returned %d)\n", (unsigned long long)report->fences,
            (unsigned long long)report->points_tested, (unsigned long long)report->failures,
            report->workload_status);
    uint64_t shown = report->failures < FAILURES_KEPT ? report->failures : FAILURES_KEPT;
    for (uint64_t i = 0; i < shown; i++) {
        const nvh_crash_failure *fl = &report->first[i];
        char why[128];
        describe_status(fl->status, why, sizeof why);
        fprintf(f, "failure %llu: fence %llu%s, seed %#llx, %llu lines in flight, status %d%s\n",
                (unsigned long long)(i + 1), (unsigned long long)fl->point.fence,
                fl->point.fence == report->fences ? " (final point, after the workload)" : "",
                (unsigned long long)fl->point.seed,
                (unsigned long long)fl->point.lines_differing, fl->status, why);
        fprintf(f, "  crash point:\n%s", fl->backtrace);
        size_t blen = strlen(fl->backtrace);
        if (blen == 0 || fl->backtrace[blen - 1] != '\n') fputc('\n', f);
    }
    if (report->failures > shown)
        fprintf(f, "... and %llu more failures (only the first %llu are recorded)\n",
                (unsigned long long)(report->failures - shown), (unsigned long long)shown);
    if (shown)
        fprintf(f, "hint: #0 is the fence (nvh_sim_drain); the first frame outside "
                "libnvheap after it is the code that fenced. 'prog(+0xOFF)' frames resolve "
                "with addr2line -f -e prog 0xOFF; keep_failed_images keeps the images "
                "(docs/SIM.md)\n");
}
