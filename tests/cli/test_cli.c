/* test_cli.c — the `nvheap` tool and the hello_pool example, run as real
 * programs (their paths come from $NVHEAP_CLI and $NVHEAP_HELLO, set by
 * tests/cli/CMakeLists.txt): help and usage errors, create (sizes, refusing
 * to overwrite), info (keys, values, JSON, statistics), check (good pool,
 * corrupt header, state slots, truncation, files it cannot check; every
 * B+ tree and hash map; --repair's backup and salvage), FIFOs refused at
 * once, that info and check never modify a pool, and hello_pool run twice. */
#include "test_util.h"

#include "pool/format.h"
#include "alloc/alloc.h"   /* nvh_rhdr_off: where a region's header lives */

#include <stdbool.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <time.h>

/* ==========================================================================
 * Running a program and looking at what it printed
 * ========================================================================== */
struct run {
    int status;              /* exit status, or 128+signal */
    char out[32768];
    char err[8192];
};

static const char *scratch_dir(void)
{
    const char *dir = getenv("NVHEAP_TEST_DIR");
    if (!dir || !*dir) dir = "/tmp";
    mkdir(dir, 0700);
    return dir;
}

static void slurp(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, len - 1, f) : 0;
    buf[n] = '\0';
    if (f) fclose(f);
}

/* Run argv (argv[0] looked up in PATH unless it contains a '/'), stdout and
 * stderr captured into r; stdin from in_path (NULL: /dev/null), and stdout
 * also left in out_path when that is not NULL (for outputs larger than
 * r->out). Returns the exit status. */
static int run_argv_io(struct run *r, const char *const argv[], const char *in_path,
                       const char *keep_out)
{
    char out_path[512], err_path[512];
    snprintf(out_path, sizeof out_path, "%s/cli-stdout-%d.txt", scratch_dir(), (int)getpid());
    if (keep_out) snprintf(out_path, sizeof out_path, "%s", keep_out);
    snprintf(err_path, sizeof err_path, "%s/cli-stderr-%d.txt", scratch_dir(), (int)getpid());
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int in = open(in_path ? in_path : "/dev/null", O_RDONLY);
        if (out < 0 || err < 0 || in < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0 ||
            dup2(in, 0) < 0)
            _exit(126);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    int wstatus;
    while (waitpid(pid, &wstatus, 0) < 0) assert_int_equal(errno, EINTR);
    r->status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
    slurp(out_path, r->out, sizeof r->out);
    slurp(err_path, r->err, sizeof r->err);
    if (!keep_out) unlink(out_path);
    unlink(err_path);
    return r->status;
}

static int run_argv(struct run *r, const char *const argv[])
{
    return run_argv_io(r, argv, NULL, NULL);
}

/* The program named by the variable env (set by ctest), else the one this
 * build made (built_path), so that the binary also runs by hand. */
static const char *program(const char *env, const char *built_path)
{
    const char *path = getenv(env);
    return path && *path ? path : built_path;
}
static const char *cli_path(void) { return program("NVHEAP_CLI", NVHEAP_CLI_BUILT); }
static const char *hello_path(void) { return program("NVHEAP_HELLO", NVHEAP_HELLO_BUILT); }

/* Run `program` with the NULL-terminated arguments that follow. */
static int run_program(struct run *r, const char *prog, va_list ap)
{
    const char *argv[32] = {prog};
    size_t n = 1;
    const char *arg;
    while ((arg = va_arg(ap, const char *)) != NULL) {
        assert_true(n < 31);
        argv[n++] = arg;
    }
    argv[n] = NULL;
    return run_argv(r, argv);
}

static int run_cli_(struct run *r, ...)
{
    va_list ap;
    va_start(ap, r);
    int status = run_program(r, cli_path(), ap);
    va_end(ap);
    return status;
}
#define CLI(r, ...) run_cli_((r), __VA_ARGS__, (const char *)NULL)

static int run_hello_(struct run *r, ...)
{
    va_list ap;
    va_start(ap, r);
    int status = run_program(r, hello_path(), ap);
    va_end(ap);
    return status;
}
#define HELLO(r, ...) run_hello_((r), __VA_ARGS__, (const char *)NULL)

/* Fail with the program's output when a status is not the expected one. */
#define EXPECT_STATUS(r, expected)                                                     \
    do {                                                                               \
        if ((r)->status != (expected))                                                 \
            fail_msg("exit status %d, expected %d\nstdout:\n%s\nstderr:\n%s",          \
                     (r)->status, (expected), (r)->out, (r)->err);                     \
    } while (0)

#define EXPECT_CONTAINS(text, needle)                                                  \
    do {                                                                               \
        if (!strstr((text), (needle)))                                                 \
            fail_msg("expected \"%s\" in:\n%s", (needle), (text));                     \
    } while (0)

/* The value of "key: value" in `nvheap info` output, or NULL. */
static const char *value_of(const char *out, const char *key, char *buf, size_t len)
{
    size_t key_len = strlen(key);
    for (const char *line = out; *line;) {
        if (strncmp(line, key, key_len) == 0 && line[key_len] == ':') {
            const char *v = line + key_len + 1;
            if (*v == ' ') v++;
            size_t n = strcspn(v, "\n");
            if (n >= len) n = len - 1;
            memcpy(buf, v, n);
            buf[n] = '\0';
            return buf;
        }
        const char *nl = strchr(line, '\n');
        if (!nl) break;
        line = nl + 1;
    }
    return NULL;
}

static const char *str_of(const char *out, const char *key)
{
    static char buf[4][256];
    static unsigned next;
    char *b = buf[next++ % 4];
    if (!value_of(out, key, b, sizeof buf[0])) fail_msg("no key '%s' in:\n%s", key, out);
    return b;
}

static uint64_t u64_of(const char *out, const char *key)
{
    const char *v = str_of(out, key);
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    if (!*v || *end) fail_msg("key '%s' is '%s', not a number", key, v);
    return n;
}

/* ==========================================================================
 * Files
 * ========================================================================== */
/* A fresh scratch path (copied: test_path's buffers rotate). */
static void fresh_path(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s", test_path(name));
}

static bool exists(const char *path)
{
    return access(path, F_OK) == 0;
}

/* Everything observable of a file without opening it as a pool. */
struct fingerprint {
    uint64_t hash;
    off_t size;
    struct timespec mtime;
};

static struct fingerprint fingerprint(const char *path)
{
    struct fingerprint f = {.hash = test_file_hash(path)};
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    f.size = st.st_size;
    f.mtime = st.st_mtim;
    return f;
}

static void assert_unchanged(const char *path, struct fingerprint before)
{
    struct fingerprint after = fingerprint(path);
    assert_int_equal(after.hash, before.hash);
    assert_int_equal(after.size, before.size);
    assert_int_equal(after.mtime.tv_sec, before.mtime.tv_sec);
    assert_int_equal(after.mtime.tv_nsec, before.mtime.tv_nsec);
}

static void create_pool(const char *path, const char *size, const char *layout)
{
    struct run r;
    CLI(&r, "create", path, "--size", size, "--layout", layout);
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "created");
}

static void flip_byte(const char *path, off_t off)
{
    unsigned char b;
    test_peek(path, off, &b, 1);
    b ^= 0xff;
    test_poke(path, off, &b, 1);
}

static void write_file(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    close(fd);
}

/* ==========================================================================
 * help and usage
 * ========================================================================== */
static void help_everywhere(void **state)
{
    (void)state;
    static const char *const helps[][3] = {
        {"--help"}, {"-h"}, {"help"}, {"help", "create"}, {"help", "info"}, {"help", "check"},
        {"create", "--help"}, {"info", "--help"}, {"check", "--help"}, {"check", "-h"},
        {"info", "some.pool", "--help"}, {"help", "ls"}, {"help", "stat"}, {"help", "dump"},
        {"help", "load"}, {"help", "get"}, {"help", "put"}, {"help", "rm"}, {"stat", "--help"},
        {"put", "p", "--help"},
    };
    struct run r;
    for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++) {
        const char *argv[5] = {cli_path(), helps[i][0], helps[i][1], helps[i][2]};
        run_argv(&r, argv);
        EXPECT_STATUS(&r, 0);
        EXPECT_CONTAINS(r.out, "usage: nvheap");
        assert_string_equal(r.err, "");
    }
    CLI(&r, "help", "create");
    EXPECT_CONTAINS(r.out, "--root-size");
    CLI(&r, "--help");
    static const char *const listed[] = {"ls", "stat", "dump", "load", "get", "put", "rm"};
    for (size_t i = 0; i < sizeof listed / sizeof listed[0]; i++) {
        char line[32];
        snprintf(line, sizeof line, "  %-8s ", listed[i]);
        EXPECT_CONTAINS(r.out, line);
    }
    CLI(&r, "dump", "some.pool");
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "missing STORE");
    CLI(&r, "rm", "p", "s", "k", "extra");
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "unexpected argument 'extra'");
    CLI(&r, "--version");
    EXPECT_STATUS(&r, 0);
    char version[64];
    snprintf(version, sizeof version, "nvheap %d.%d.%d ", NVH_VERSION_MAJOR, NVH_VERSION_MINOR,
             NVH_VERSION_PATCH);
    EXPECT_CONTAINS(r.out, version);
}

static void usage_errors(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "usage");
    struct run r;
    const char *bare[] = {cli_path(), NULL};
    run_argv(&r, bare);
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "usage: nvheap");

    static const char *const bad[][4] = {
        {"frobnicate"},                          /* unknown command */
        {"help", "frobnicate"},
        {"info"},                                /* missing PATH */
        {"info", "a.pool", "--bogus"},           /* unknown option */
        {"info", "a.pool", "-x"},
        {"info", "a.pool", "--size", "1M"},      /* option of another command */
        {"info", "a.pool", "--json=yes"},        /* flag given a value */
        {"check", "a.pool", "b.pool"},           /* two paths */
        {"create", "a.pool", "--size"},          /* option without its value */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *argv[6] = {cli_path(), bad[i][0], bad[i][1], bad[i][2],
                               bad[i][3]};
        run_argv(&r, argv);
        EXPECT_STATUS(&r, 2);
        EXPECT_CONTAINS(r.err, "nvheap: ");
        EXPECT_CONTAINS(r.err, "usage: nvheap");
        assert_string_equal(r.out, "");
    }
    CLI(&r, "create", path);                     /* --size is required */
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "--size");
    assert_false(exists(path));
}

/* ==========================================================================
 * create and info
 * ========================================================================== */
static bool is_uuid(const char *s)
{
    if (strlen(s) != 36) return false;
    for (int i = 0; i < 36; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? s[i] != '-' : !strchr("0123456789abcdef", s[i])) return false;
    }
    return s[14] == '4';   /* version 4 (random) */
}

static bool is_domain(const char *s)
{
    nvh_domain d;
    return nvh_domain_parse(s, &d) == NVH_OK && d != NVH_DOMAIN_AUTO;
}

static void create_then_info(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "info");
    create_pool(path, "2M", "cli-info");
    struct run r;
    CLI(&r, "info", path);
    EXPECT_STATUS(&r, 0);
    assert_string_equal(str_of(r.out, "path"), path);
    assert_string_equal(str_of(r.out, "layout"), "cli-info");
    assert_int_equal(u64_of(r.out, "size"), 2 << 20);
    assert_int_equal(u64_of(r.out, "epoch"), 1);           /* create's open */
    assert_int_equal(u64_of(r.out, "format-version"), NVH_FORMAT_VERSION);
    assert_int_equal(u64_of(r.out, "root-offset"), 4096);
    assert_int_equal(u64_of(r.out, "root-size"), 4096);
    assert_int_equal(u64_of(r.out, "heap-offset"), 8192);
    assert_int_equal(u64_of(r.out, "heap-size"), (2 << 20) - 8192);
    assert_string_equal(str_of(r.out, "open-mode"), "read-only");
    assert_true(is_domain(str_of(r.out, "domain")));
    assert_true(is_domain(str_of(r.out, "detected-domain")));
    const char *flush = str_of(r.out, "flush-instruction");
    assert_true(strcmp(flush, "clwb") == 0 || strcmp(flush, "clflushopt") == 0 ||
                strcmp(flush, "clflush") == 0 || strcmp(flush, "none") == 0);
    assert_int_equal(u64_of(r.out, "max-size"), (uint64_t)64 << 30);  /* the default */
    assert_string_equal(str_of(r.out, "closed-cleanly"), "yes");
    char buf[64];
    assert_null(value_of(r.out, "fences", buf, sizeof buf));   /* only with --stats */

    /* --max-size is recorded in the pool and shown by every later info */

    /* uuid: canonical form, and the one the library reads */
    const char *uuid = str_of(r.out, "uuid");
    assert_true(is_uuid(uuid));
    nvh_pool *pool = nvh_pool_open(path, "cli-info", NVH_OPEN_READONLY);
    assert_non_null(pool);
    nvh_pool_info info;
    assert_int_equal(nvh_pool_info_get(pool, &info), NVH_OK);
    char expected[40];
    snprintf(expected, sizeof expected,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             info.uuid[0], info.uuid[1], info.uuid[2], info.uuid[3], info.uuid[4], info.uuid[5],
             info.uuid[6], info.uuid[7], info.uuid[8], info.uuid[9], info.uuid[10],
             info.uuid[11], info.uuid[12], info.uuid[13], info.uuid[14], info.uuid[15]);
    assert_string_equal(uuid, expected);
    assert_string_equal(str_of(r.out, "domain"), nvh_domain_name(info.created_domain));
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    /* created: ISO-8601 UTC, within a day of now */
    struct tm tm = {0};
    const char *created = str_of(r.out, "created");
    const char *rest = strptime(created, "%Y-%m-%dT%H:%M:%SZ", &tm);
    assert_non_null(rest);
    assert_int_equal(*rest, '\0');
    double age = difftime(time(NULL), timegm(&tm));
    assert_true(age > -86400 && age < 86400);
    unlink(path);

    /* options of create show up in info */
    CLI(&r, "create", path, "--size", "4M", "--root-size", "8K", "--domain", "process",
        "--max-size", "1G");
    EXPECT_STATUS(&r, 0);
    CLI(&r, "info", path, "--layout", "");
    EXPECT_STATUS(&r, 0);
    assert_string_equal(str_of(r.out, "layout"), "");
    assert_string_equal(str_of(r.out, "domain"), "process");
    assert_int_equal(u64_of(r.out, "root-size"), 8192);
    assert_int_equal(u64_of(r.out, "heap-offset"), 12288);
    assert_int_equal(u64_of(r.out, "heap-size"), (4 << 20) - 12288);
    CLI(&r, "info", path, "--layout", "other");            /* wrong layout */
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "nvheap: ");
    EXPECT_CONTAINS(r.err, "layout");
    unlink(path);

    /* --max-size is recorded in the pool and shown by every later info */
    char limited[512];
    fresh_path(limited, sizeof limited, "info-max");
    CLI(&r, "create", limited, "--size", "2M", "--max-size", "8M");
    EXPECT_STATUS(&r, 0);
    CLI(&r, "info", limited);
    EXPECT_STATUS(&r, 0);
    assert_int_equal(u64_of(r.out, "max-size"), 8 << 20);
    unlink(limited);
}

static void create_refuses_existing(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "exists");
    create_pool(path, "1M", "first");
    struct fingerprint before = fingerprint(path);
    struct run r;
    CLI(&r, "create", path, "--size", "2M", "--layout", "second");
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "nvheap: ");
    EXPECT_CONTAINS(r.err, "exists");
    assert_unchanged(path, before);
    unlink(path);

    /* nor any other file */
    write_file(path, "precious data\n", 14);
    before = fingerprint(path);
    CLI(&r, "create", path, "--size", "1M");
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "exists");
    assert_unchanged(path, before);
    unlink(path);
}

static void size_suffixes(void **state)
{
    (void)state;
    static const struct { const char *text; uint64_t bytes; bool sparse; } sizes[] = {
        {"1M", 1 << 20, false},     {"2m", 2 << 20, false},        {"3MiB", 3 << 20, false},
        {"1048576", 1 << 20, false}, {"1536K", 1536 << 10, false}, {"2048kib", 2 << 20, false},
        {"2MB", 2 << 20, false},     {"1048576B", 1 << 20, false}, {"1G", 1ull << 30, true},
        {"1gib", 1ull << 30, true},
    };
    char path[512];
    struct run r;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        fresh_path(path, sizeof path, "sizes");
        if (sizes[i].sparse)
            CLI(&r, "create", path, "--size", sizes[i].text, "--sparse");
        else
            CLI(&r, "create", path, "--size", sizes[i].text);
        EXPECT_STATUS(&r, 0);
        CLI(&r, "info", path);
        EXPECT_STATUS(&r, 0);
        if (u64_of(r.out, "size") != sizes[i].bytes)
            fail_msg("--size %s gave %llu bytes", sizes[i].text,
                     (unsigned long long)u64_of(r.out, "size"));
        unlink(path);
    }
}

static void bad_sizes_rejected(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "", "abc", "M", "1.5M", "-1M", "+1M", " 1M", "1M ", "1X", "1MM", "1Mi", "5iB",
        "1KiBB", "0x100000", "1e6", "99999999999999999999", "18446744073709551616",
        "16777216T", "17179869184G",
    };
    char path[512];
    fresh_path(path, sizeof path, "badsize");
    struct run r;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CLI(&r, "create", path, "--size", bad[i]);
        EXPECT_STATUS(&r, 2);
        EXPECT_CONTAINS(r.err, "nvheap: invalid --size");
        assert_false(exists(path));
        CLI(&r, "create", path, "--size", "1M", "--root-size", bad[i]);
        EXPECT_STATUS(&r, 2);
        EXPECT_CONTAINS(r.err, "nvheap: invalid --root-size");
        assert_false(exists(path));
    }
    /* well-formed but out of range: the library or the tool says why */
    static const char *const out_of_range[][6] = {
        {"--size", "0"},
        {"--size", "512K"},                           /* below 1 MiB */
        {"--size", "17T"},                            /* above 16 TiB */
        {"--size", "1M", "--root-size", "0"},
        {"--size", "4M", "--root-size", "2G"},
        {"--size", "1M", "--root-size", "1M"},        /* root leaves no heap page */
        {"--size", "2M", "--max-size", "1M"},
        {"--size", "2M", "--max-size", "0"},
        {"--size", "2M", "--domain", "bogus"},
        {"--size", "2M", "--layout",
         "0123456789012345678901234567890123456789012345678901234567890123"}, /* 64 bytes */
    };
    for (size_t i = 0; i < sizeof out_of_range / sizeof out_of_range[0]; i++) {
        const char *argv[10] = {cli_path(), "create", path};
        for (size_t j = 0; j < 6; j++) argv[3 + j] = out_of_range[i][j];
        run_argv(&r, argv);
        EXPECT_STATUS(&r, 2);
        EXPECT_CONTAINS(r.err, "nvheap: ");
        assert_false(exists(path));
    }
}

/* Run python3's json module on `json_text` and return what the script
 * printed; false if there is no python3 here. */
static bool python_json(const char *json_text, const char *script, struct run *r)
{
    struct run probe;
    const char *probe_argv[] = {"python3", "-c", "import json", NULL};
    if (run_argv(&probe, probe_argv) != 0) return false;
    char file[512];
    snprintf(file, sizeof file, "%s/cli-json-%d.json", scratch_dir(), (int)getpid());
    write_file(file, json_text, strlen(json_text));
    const char *argv[] = {"python3", "-c", script, file, NULL};
    run_argv(r, argv);
    unlink(file);
    return true;
}

static void info_json(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "json");
    create_pool(path, "2M", "we\"ird\\name");
    struct run r;
    CLI(&r, "info", path, "--json", "--stats");
    EXPECT_STATUS(&r, 0);
    /* key search works without python */
    assert_int_equal(r.out[0], '{');
    EXPECT_CONTAINS(r.out, "\n}\n");
    EXPECT_CONTAINS(r.out, "\"size\": 2097152");
    EXPECT_CONTAINS(r.out, "\"epoch\": 1");
    EXPECT_CONTAINS(r.out, "\"layout\": \"we\\\"ird\\\\name\"");
    EXPECT_CONTAINS(r.out, "\"heap-offset\": 8192");
    EXPECT_CONTAINS(r.out, "\"lines-flushed\": 0");
    struct run py;
    if (python_json(r.out,
                    "import json, sys\n"
                    "d = json.load(open(sys.argv[1]))\n"
                    "print(d['layout'], d['size'], d['epoch'], d['format-version'],\n"
                    "      d['fences'], d['open-mode'], len(d['uuid']), sep='|')\n",
                    &py)) {
        EXPECT_STATUS(&py, 0);
        char want[64];
        snprintf(want, sizeof want, "we\"ird\\name|2097152|1|%u|0|read-only|36\n",
                 NVH_FORMAT_VERSION);
        assert_string_equal(py.out, want);
    } else {
        print_message("python3 not found: JSON checked by key search only\n");
    }
    /* the same keys as the text form */
    struct run text;
    CLI(&text, "info", path, "--stats");
    EXPECT_STATUS(&text, 0);
    for (const char *line = text.out; *line && strchr(line, '\n');
         line = strchr(line, '\n') + 1) {
        char key[64];
        size_t n = strcspn(line, ":");
        assert_true(n < sizeof key - 3);
        snprintf(key, sizeof key, "\"%.*s\":", (int)n, line);
        EXPECT_CONTAINS(r.out, key);
    }
    unlink(path);
}

static void info_stats(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "stats");
    create_pool(path, "1M", "stats");
    struct fingerprint before = fingerprint(path);
    struct run r;
    /* read-only open: flushes nothing, changes nothing */
    CLI(&r, "info", path, "--stats");
    EXPECT_STATUS(&r, 0);
    assert_int_equal(u64_of(r.out, "lines-flushed"), 0);
    assert_int_equal(u64_of(r.out, "fences"), 0);
    assert_int_equal(u64_of(r.out, "msyncs"), 0);
    assert_int_equal(u64_of(r.out, "nt-bytes"), 0);
    assert_unchanged(path, before);
    /* --rw: a real open; the epoch bump costs a flushed line and a fence */
    CLI(&r, "info", path, "--stats", "--rw", "--domain", "msync");
    EXPECT_STATUS(&r, 0);
    assert_string_equal(str_of(r.out, "open-mode"), "read-write");
    assert_string_equal(str_of(r.out, "detected-domain"), "msync");
    assert_int_equal(u64_of(r.out, "epoch"), 2);
    assert_true(u64_of(r.out, "lines-flushed") >= 1);
    assert_true(u64_of(r.out, "fences") >= 1);
    assert_true(u64_of(r.out, "msyncs") >= 1);
    CLI(&r, "info", path);
    EXPECT_STATUS(&r, 0);
    assert_int_equal(u64_of(r.out, "epoch"), 2);
    CLI(&r, "info", path, "--domain", "sim");   /* sim needs a read-write open */
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "nvheap: ");
    unlink(path);
}

/* ==========================================================================
 * check
 * ========================================================================== */
static void read_only_commands_never_modify(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "readonly");
    create_pool(path, "2M", "ro");
    /* a corrupt non-current slot too: check reports it, must not repair it */
    flip_byte(path, NVH_STATE_SLOT_OFFSET + 16);
    struct fingerprint before = fingerprint(path);
    static const char *const commands[][4] = {
        {"info"}, {"info", "--stats"}, {"info", "--json"}, {"info", "--stats", "--json"},
        {"info", "--layout", "ro"}, {"info", "--domain", "pmem"}, {"check"},
        {"check", "--layout", "ro"}, {"ls"}, {"ls", "--json"}, {"stat"}, {"stat", "--json"},
    };
    struct run r;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        const char *argv[7] = {cli_path(), commands[i][0], path, commands[i][1],
                               commands[i][2], commands[i][3]};
        run_argv(&r, argv);
        EXPECT_STATUS(&r, 0);
        assert_unchanged(path, before);
    }
    unlink(path);
}

static void check_good_pool(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "good");
    create_pool(path, "2M", "good");
    struct run r;
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "consistent (0 errors, 0 warnings)");
    CLI(&r, "check", path, "--layout", "good");
    EXPECT_STATUS(&r, 0);
    CLI(&r, "check", path, "--layout", "bad");
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "layout 'good', expected 'bad'");
    unlink(path);
}

static void check_corrupt_header(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "header");
    create_pool(path, "2M", "header");
    flip_byte(path, 20);                          /* inside the uuid */
    struct fingerprint before = fingerprint(path);
    struct run r;
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 1);
    EXPECT_CONTAINS(r.out, "error: offset 0: superblock header");
    EXPECT_CONTAINS(r.out, "offset 508");
    EXPECT_CONTAINS(r.out, "INCONSISTENT");
    assert_unchanged(path, before);
    CLI(&r, "info", path);                        /* the library refuses it too */
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "checksum");
    unlink(path);
}

/* The heap checker: a corrupt region header is an error with its offset;
 * --repair quarantines it; afterwards the pool checks clean, the region is
 * gone from the live objects, and every other object is intact. */
static void check_heap_corruption(void **state)
{
    (void)state;
    enum { OBJECTS = 20, OBJECT_SIZE = 3000, VICTIM = 5 };
    char path[512];
    fresh_path(path, sizeof path, "heap");
    create_pool(path, "8M", "heap");
    nvh_pool *pool = nvh_pool_open(path, "heap", NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_off_t *links = nvh_root(pool, NULL);
    for (unsigned i = 0; i < OBJECTS; i++) {
        unsigned char *obj = nvh_reserve(pool, OBJECT_SIZE);
        assert_non_null(obj);
        memset(obj, 'a' + (int)i, OBJECT_SIZE);
        nvh_persist(pool, obj, OBJECT_SIZE);
        nvh_off_t *link = &links[i];
        assert_int_equal(nvh_activate(pool, obj, &link, 1), NVH_OK);
    }
    /* a large object starts at a block; its header is in a header chunk */
    uint64_t region = links[VICTIM];
    assert_int_equal((region - pool->heap->chunks_off) % 4096, 0);
    uint64_t header = nvh_rhdr_off(pool->heap, (region - pool->heap->chunks_off) / 4096);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    flip_byte(path, (off_t)header + 12);    /* the region's size in blocks */
    struct fingerprint before = fingerprint(path);
    struct run r;
    char expect[128];
    snprintf(expect, sizeof expect, "error: offset %llu: heap region", (unsigned long long)region);
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 1);
    EXPECT_CONTAINS(r.out, expect);
    EXPECT_CONTAINS(r.out, "corrupt region header");
    assert_unchanged(path, before);

    CLI(&r, "check", path, "--repair");
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "(quarantined");
    EXPECT_CONTAINS(r.out, "consistent after repair");
    char bak[600];
    snprintf(bak, sizeof bak, "%s.bak", path);
    assert_true(exists(bak));                   /* written before the repair */
    unlink(bak);
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "consistent (0 errors, 0 warnings)");
    CLI(&r, "info", path, "--stats");
    EXPECT_STATUS(&r, 0);
    assert_int_equal(u64_of(r.out, "live-objects"), OBJECTS - 1);
    assert_true(u64_of(r.out, "quarantined-bytes") >= 4096);

    pool = nvh_pool_open(path, "heap", NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    links = nvh_root(pool, NULL);
    for (unsigned i = 0; i < OBJECTS; i++) {
        if (i == VICTIM) continue;
        const unsigned char *obj = nvh_ptr(pool, links[i]);
        for (unsigned k = 0; k < OBJECT_SIZE; k++)
            if (obj[k] != 'a' + i) fail_msg("object %u byte %u damaged", i, k);
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void check_state_slots(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "slots");
    create_pool(path, "2M", "slots");
    struct nvh_superblock sb;
    test_peek(path, 0, &sb, sizeof sb);
    unsigned cur = sb.state[1].sequence > sb.state[0].sequence ? 1 : 0, other = 1 - cur;
    off_t cur_off = NVH_STATE_SLOT_OFFSET + 64 * cur, other_off = NVH_STATE_SLOT_OFFSET + 64 * other;
    char cur_at[64], other_at[64];
    snprintf(cur_at, sizeof cur_at, "offset %lld:", (long long)cur_off);
    snprintf(other_at, sizeof other_at, "offset %lld:", (long long)other_off);
    struct run r;

    /* the non-current slot is torn: a warning, the pool is consistent */
    flip_byte(path, other_off + 16);
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "warning: ");
    EXPECT_CONTAINS(r.out, other_at);
    EXPECT_CONTAINS(r.out, "consistent (0 errors, 1 warning)");
    nvh_pool *pool = nvh_pool_open(path, "slots", NVH_OPEN_READONLY);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_epoch(pool), sb.state[cur].epoch);
    nvh_pool_close(pool);
    flip_byte(path, other_off + 16);              /* repaired */

    /* the newest slot is torn: the pool falls back to the previous state,
     * which is what a crash during a state update leaves — still consistent */
    flip_byte(path, cur_off + 16);
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, cur_at);
    EXPECT_CONTAINS(r.out, "newer than the current slot's");

    /* both torn: nothing to open, inconsistent */
    flip_byte(path, other_off + 16);
    struct fingerprint before = fingerprint(path);
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 1);
    EXPECT_CONTAINS(r.out, "error: offset 512: state slot 0");
    EXPECT_CONTAINS(r.out, "error: offset 576: state slot 1");
    EXPECT_CONTAINS(r.out, "INCONSISTENT");
    assert_unchanged(path, before);
    assert_null(nvh_pool_open(path, NULL, NVH_OPEN_READONLY));
    assert_int_equal(nvh_errcode(), NVH_E_CHECKSUM);
    unlink(path);
}

static void check_truncated(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "trunc");
    create_pool(path, "2M", "trunc");
    struct run r;
    assert_int_equal(truncate(path, 1 << 20), 0);
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 1);
    EXPECT_CONTAINS(r.out, "error: offset 1048576: file is truncated");
    assert_int_equal(truncate(path, 100), 0);     /* not even a superblock */
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 1);
    EXPECT_CONTAINS(r.out, "truncated");
    unlink(path);
}

static void check_cannot_check(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "cannot");
    struct run r;
    CLI(&r, "check", path);                       /* missing */
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "nvheap: ");
    EXPECT_CONTAINS(r.err, path);
    CLI(&r, "info", path);
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "nvheap: ");

    unsigned char junk[8192];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(i * 131 + 7);
    write_file(path, junk, sizeof junk);          /* not a pool */
    struct fingerprint before = fingerprint(path);
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "not an nvheap pool");
    assert_unchanged(path, before);
    write_file(path, "", 0);                      /* empty */
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 2);
    unlink(path);
    CLI(&r, "check", scratch_dir());              /* a directory */
    EXPECT_STATUS(&r, 2);

    create_pool(path, "1M", "cannot");            /* newer format version */
    uint32_t version = 99;
    test_poke(path, 8, &version, sizeof version);
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "format version 99");
    unlink(path);

    create_pool(path, "1M", "cannot");            /* busy: open read-write here */
    nvh_pool *pool = nvh_pool_open(path, "cannot", NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "in use");
    CLI(&r, "info", path);
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "in use");
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 0);
    unlink(path);
}

/* ==========================================================================
 * Help text (issue 18 item 5)
 * ========================================================================== */
static void help_text_accurate(void **state)
{
    (void)state;
    struct run r;
    CLI(&r, "create", "--help");
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "recorded in the pool");
    if (strstr(r.out, "not recorded")) fail_msg("create --help still says --max-size is not recorded:\n%s", r.out);
    /* check's -h line belongs to its option list, before the closing paragraph */
    CLI(&r, "check", "--help");
    EXPECT_STATUS(&r, 0);
    const char *h = strstr(r.out, "-h, --help");
    const char *para = strstr(r.out, "Exit status");
    assert_non_null(h);
    assert_non_null(para);
    if (h > para) fail_msg("check --help prints -h after its closing paragraph:\n%s", r.out);
    EXPECT_CONTAINS(r.out, "--no-backup");
}

/* ==========================================================================
 * FIFOs fail at once instead of blocking (issue 18 item 4)
 * ========================================================================== */
static void fifo_is_not_a_pool(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "fifo");
    assert_int_equal(mkfifo(path, 0600), 0);
    /* the library, in a child with a deadline: a blocking open hangs there */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(10);
        nvh_pool *p = nvh_pool_open(path, NULL, NVH_OPEN_READONLY);
        _exit(p == NULL && nvh_errcode() == NVH_E_INVAL &&
                      strstr(nvh_errormsg(), "not a regular file") ? 0 : 1);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("read-only nvh_pool_open of a FIFO: %s", WIFSIGNALED(st) ? "hung (killed)" : "did not fail as 'not a regular file'");
    /* the tool: alarm() survives exec, so a blocking open is killed */
    static const char *const cmds[][2] = {{"check", NULL}, {"info", NULL}};
    for (size_t i = 0; i < 2; i++) {
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            int null = open("/dev/null", O_WRONLY);
            dup2(null, 1);
            dup2(null, 2);
            alarm(10);
            execl(cli_path(), cli_path(), cmds[i][0], path, (char *)NULL);
            _exit(127);
        }
        assert_int_equal(waitpid(pid, &st, 0), pid);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 2)
            fail_msg("nvheap %s FIFO: %s %d", cmds[i][0], WIFSIGNALED(st) ? "signal" : "exit",
                     WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    }
    struct run r;
    CLI(&r, "check", path);
    EXPECT_CONTAINS(r.err, "not a regular file");
    unlink(path);
}

/* ==========================================================================
 * check and --repair on B+ trees and hash maps (issue 18 item 3)
 * ========================================================================== */
enum { TREE_KEYS = 300, MAP_KEYS = 200 };

static void tree_value(uint64_t key, char *buf, size_t len)
{
    snprintf(buf, len, "value-%llu", (unsigned long long)key);
}

/* A pool with a tree "t" of TREE_KEYS keys (several levels) and a hash map
 * at root[0] with MAP_KEYS entries. Returns the tree header's offset. */
static uint64_t make_container_pool(const char *path)
{
    create_pool(path, "4M", "ds");
    nvh_pool *pool = nvh_pool_open(path, "ds", NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_btree *t = nvh_btree_open(pool, "t", 1, NULL);
    assert_non_null(t);
    char v[64];
    for (uint64_t k = 0; k < TREE_KEYS; k++) {
        tree_value(k, v, sizeof v);
        assert_int_equal(nvh_btree_put(t, k * 7, v, strlen(v) + 1), NVH_OK);
    }
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    nvh_off_t *root = nvh_root(pool, NULL);
    assert_int_equal(nvh_hmap_create(pool, &root[0], NULL), NVH_OK);
    nvh_hmap *m = nvh_hmap_open(pool, root[0]);
    assert_non_null(m);
    for (unsigned i = 0; i < MAP_KEYS; i++) {
        char key[32];
        int kl = snprintf(key, sizeof key, "k%u", i);
        assert_int_equal(nvh_hmap_put(m, key, (size_t)kl, key, (size_t)kl), NVH_OK);
    }
    assert_int_equal(nvh_hmap_close(m), NVH_OK);
    uint64_t hdr = nvh_off(pool, nvh_get_named(pool, "nvh.btree.t", NULL));
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return hdr;
}

/* Keys of tree "t" readable with their right value. */
static uint64_t tree_keys_intact(const char *path)
{
    nvh_pool *pool = nvh_pool_open(path, "ds", NVH_OPEN_READONLY);
    assert_non_null(pool);
    nvh_btree_options ro = {.mode = NVH_BTREE_FLUSH};
    nvh_btree *t = nvh_btree_open(pool, "t", 0, &ro);
    uint64_t good = 0;
    for (uint64_t k = 0; t && k < TREE_KEYS; k++) {
        const void *v;
        size_t len;
        char want[64];
        tree_value(k, want, sizeof want);
        if (nvh_btree_get(t, k * 7, &v, &len) == NVH_OK && len == strlen(want) + 1 &&
            memcmp(v, want, len) == 0)
            good++;
    }
    if (t) nvh_btree_close(t);
    nvh_pool_close(pool);
    return good;
}

static void bak_path(char *buf, size_t len, const char *path)
{
    snprintf(buf, len, "%s.bak", path);
}

static void check_reports_containers(void **state)
{
    (void)state;
    char path[512], bak[600];
    fresh_path(path, sizeof path, "ds");
    make_container_pool(path);
    struct run r;
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "B+ tree 't': 300 keys, consistent");
    EXPECT_CONTAINS(r.out, "hash map: 200 entries, consistent");
    /* --repair on a consistent pool writes nothing, not even a backup */
    struct fingerprint before = fingerprint(path);
    CLI(&r, "check", path, "--repair");
    EXPECT_STATUS(&r, 0);
    assert_unchanged(path, before);
    bak_path(bak, sizeof bak, path);
    assert_false(exists(bak));
    CLI(&r, "check", path, "--no-backup");        /* only with --repair */
    EXPECT_STATUS(&r, 2);
    unlink(path);
}

/* The tree's first leaf-level child pointer of the root points outside the
 * pool: check reports the tree (it crashed readers before), repair backs the
 * pool up, rebuilds the tree from every readable key and checks clean. */
static void repair_salvages_tree(void **state)
{
    (void)state;
    char path[512], bak[600];
    fresh_path(path, sizeof path, "dstree");
    uint64_t hdr = make_container_pool(path);
    uint64_t rootoff;
    test_peek(path, (off_t)hdr + 16, &rootoff, 8);  /* bt_header.root */
    uint32_t level;
    test_peek(path, (off_t)rootoff + 8, &level, 4);
    assert_true(level >= 1);                        /* splits made an inner root */
    /* first used slot of the root: entries start at 64, 16 B each (key, ptr) */
    off_t slot = 0;
    for (unsigned i = 0; i < 60 && !slot; i++) {
        uint64_t ptr;
        test_peek(path, (off_t)rootoff + 64 + 16 * i + 8, &ptr, 8);
        if (ptr) slot = (off_t)rootoff + 64 + 16 * i + 8;
    }
    assert_true(slot != 0);
    uint64_t wild = 0xdeadbeef000ull;
    test_poke(path, slot, &wild, 8);
    uint64_t readable = tree_keys_intact(path);     /* no crash; some keys lost */
    assert_true(readable > 0 && readable < TREE_KEYS);

    struct run r;
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 1);
    EXPECT_CONTAINS(r.out, "B+ tree 't'");
    EXPECT_CONTAINS(r.out, "corrupt");
    struct fingerprint before = fingerprint(path);
    CLI(&r, "check", path, "--repair");
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "backup of the pool written to");
    EXPECT_CONTAINS(r.out, "B+ tree 't' rebuilt");
    EXPECT_CONTAINS(r.out, "consistent after repair");
    bak_path(bak, sizeof bak, path);
    assert_true(exists(bak));
    struct fingerprint saved = fingerprint(bak);
    assert_int_equal(saved.hash, before.hash);      /* the backup is the damaged pool */
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 0);
    assert_int_equal(tree_keys_intact(path), readable);   /* every readable key kept */
    unlink(bak);
    unlink(path);
}

/* Offset of the region header of the block holding the object at obj, read
 * from the file's heap header (headers live in header chunks, alloc.h). */
static uint64_t region_header_of(const char *path, uint64_t obj)
{
    struct nvh_superblock_header sh;
    test_peek(path, 0, &sh, sizeof sh);
    struct nvh_heap_hdr hh;
    test_peek(path, (off_t)sh.heap_offset, &hh, sizeof hh);
    return nvh_rhdr_off_hh(&hh, (obj - hh.chunks_off) / NVH_BLOCK);
}

/* The case: the allocator region header covering the tree's header
 * object is damaged. Repair quarantines that region, loses at most the
 * objects it covered, and the tree above stays whole. --no-backup writes no
 * backup. */
static void repair_keeps_tree_over_bad_region(void **state)
{
    (void)state;
    char path[512], bak[600];
    fresh_path(path, sizeof path, "dsregion");
    uint64_t hdr = make_container_pool(path);
    flip_byte(path, (off_t)region_header_of(path, hdr) + 12);   /* the run's header: its size */
    struct run r;
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 1);
    EXPECT_CONTAINS(r.out, "heap region");
    CLI(&r, "check", path, "--repair", "--no-backup");
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "quarantined");
    EXPECT_CONTAINS(r.out, "B+ tree 't': 300 keys, consistent");
    bak_path(bak, sizeof bak, path);
    assert_false(exists(bak));
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 0);
    assert_int_equal(tree_keys_intact(path), TREE_KEYS);
    unlink(path);
}

/* A process that dies without closing leaves allocator effects (the new
 * nodes and entries) that only recovery applies: check judges the
 * containers as recovery leaves them, so a recoverable pool is consistent
 * and --repair has nothing to salvage (it destroyed such trees before). */
static void check_crashed_pool(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "dscrash");
    make_container_pool(path);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        nvh_pool *pool = nvh_pool_open(path, "ds", NVH_DOMAIN_PROCESS);
        nvh_btree *t = pool ? nvh_btree_open(pool, "t", 1, NULL) : NULL;
        char v[64];
        for (uint64_t k = TREE_KEYS; t && k < TREE_KEYS + 200; k++) {
            tree_value(k, v, sizeof v);
            nvh_btree_put(t, k * 7, v, strlen(v) + 1);
        }
        if (t) nvh_btree_sync(t);
        nvh_hmap *m = pool ? nvh_hmap_open(pool, ((nvh_off_t *)nvh_root(pool, NULL))[0]) : NULL;
        if (m) nvh_hmap_put(m, "late", 4, "x", 1);
        _exit(t && m ? 0 : 1);                   /* no close: a crash */
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    struct fingerprint before = fingerprint(path);
    struct run r;
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "not closed cleanly");
    EXPECT_CONTAINS(r.out, "B+ tree 't': 500 keys, consistent");
    EXPECT_CONTAINS(r.out, "hash map: 201 entries, consistent");
    CLI(&r, "check", path, "--repair");
    EXPECT_STATUS(&r, 0);
    assert_unchanged(path, before);               /* nothing to repair */
    unlink(path);
}

static int count_entry(const void *key, size_t klen, const void *value, size_t vlen, void *arg)
{
    (void)key; (void)klen; (void)value; (void)vlen;
    ++*(unsigned *)arg;
    return 0;
}

/* A hash-map entry's link points into the middle of nowhere: readers get
 * NVH_E_CORRUPT (not a crash), repair cuts the list past the damage. */
static void repair_salvages_map(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "dsmap");
    make_container_pool(path);
    nvh_pool *pool = nvh_pool_open(path, "ds", NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_off_t map = ((nvh_off_t *)nvh_root(pool, NULL))[0];
    nvh_hmap *m = nvh_hmap_open(pool, map);
    const void *v;
    size_t vl;
    assert_int_equal(nvh_hmap_get(m, "k7", 2, &v, &vl), NVH_OK);
    uint64_t entry = nvh_off(pool, v) - 32 - 2;     /* header, then key bytes */
    assert_int_equal(nvh_hmap_close(m), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    uint64_t wild = 0x7ffffffffff0ull;
    test_poke(path, (off_t)entry, &wild, 8);        /* its `next` */

    pool = nvh_pool_open(path, "ds", NVH_OPEN_READONLY);
    assert_non_null(pool);
    m = nvh_hmap_open(pool, map);
    assert_non_null(m);
    unsigned found = 0;
    int corrupt = 0;
    for (unsigned i = 0; i < MAP_KEYS; i++) {
        char key[32];
        int kl = snprintf(key, sizeof key, "k%u", i);
        int rc = nvh_hmap_get(m, key, (size_t)kl, &v, &vl);
        if (rc == NVH_OK) found++;
        else if (rc == NVH_E_CORRUPT) corrupt++;
        else assert_int_equal(rc, NVH_E_NOTFOUND);
    }
    /* only the keys of k7's bucket after it are behind the damage */
    assert_true(found + (unsigned)corrupt == MAP_KEYS && found > MAP_KEYS / 2);
    /* a walk reports the damage and goes on past it (next linked bucket) */
    unsigned walked = 0;
    assert_int_equal(nvh_hmap_foreach(m, count_entry, &walked), NVH_E_CORRUPT);
    assert_true(walked >= found - 8 && walked <= MAP_KEYS);
    assert_int_equal(nvh_hmap_close(m), NVH_OK);
    nvh_pool_close(pool);

    struct run r;
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 1);
    EXPECT_CONTAINS(r.out, "hash map");
    CLI(&r, "check", path, "--repair", "--no-backup");
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "entries in between are removed");
    EXPECT_CONTAINS(r.out, "consistent after repair");
    CLI(&r, "check", path);
    EXPECT_STATUS(&r, 0);
    unlink(path);
}

/* ==========================================================================
 * key-value stores: get/put/rm, dump/load, ls, stat
 * ========================================================================== */
/* The engines a store can be built with here: "sorted" is skipped (with a
 * message) when this library does not have it yet. */
static bool engine_available(const char *path, const char *engine)
{
    struct run r;
    CLI(&r, "put", path, "probe", "k", "v", "--create", "--engine", engine);
    if (r.status != 0) {
        EXPECT_CONTAINS(r.err, "not built");
        print_message("engine %s not available: %s", engine, r.err);
        return false;
    }
    nvh_pool *pool = nvh_pool_open(path, NULL, 0);
    assert_non_null(pool);
    assert_int_equal(nvh_kv_drop(pool, "probe"), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return true;
}

static void kv_get_put_rm(void **state)
{
    (void)state;
    char path[512], in[512], notpool[512];
    fresh_path(path, sizeof path, "kvcmds");
    fresh_path(in, sizeof in, "kvcmds.in");
    fresh_path(notpool, sizeof notpool, "kvcmds.notpool");
    create_pool(path, "8M", "kv");
    struct run r;
    /* no such store, no --create: error, nothing created */
    CLI(&r, "put", path, "s", "k", "v");
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "no store 's'");
    CLI(&r, "get", path, "s", "k");
    EXPECT_STATUS(&r, 2);
    CLI(&r, "put", path, "s", "k", "v", "--engine", "hash");
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "--engine needs --create");

    CLI(&r, "put", path, "s", "greeting", "hello world", "--create", "--engine", "hash");
    EXPECT_STATUS(&r, 0);
    CLI(&r, "get", path, "s", "greeting");
    EXPECT_STATUS(&r, 0);
    assert_string_equal(r.out, "hello world");          /* raw, no newline */
    CLI(&r, "get", path, "s", "nothing");
    EXPECT_STATUS(&r, 1);
    assert_string_equal(r.out, "");
    /* binary key and value in hex; value from stdin with '-' */
    CLI(&r, "put", path, "s", "00ff0a5c", "000102", "--hex");
    EXPECT_STATUS(&r, 0);
    CLI(&r, "get", path, "s", "00ff0a5c", "--hex");
    EXPECT_STATUS(&r, 0);
    assert_string_equal(r.out, " 000102\n");
    CLI(&r, "put", path, "s", "zz", "00", "--hex");
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "not hex");
    static const char piped[] = "line one\nline two\n\x01\x02";
    write_file(in, piped, sizeof piped - 1);
    const char *argv[] = {cli_path(), "put", path, "s", "piped", "-", NULL};
    run_argv_io(&r, argv, in, NULL);
    EXPECT_STATUS(&r, 0);
    CLI(&r, "get", path, "s", "piped");
    EXPECT_STATUS(&r, 0);
    assert_int_equal(strlen(r.out), sizeof piped - 1);
    assert_memory_equal(r.out, piped, sizeof piped - 1);
    /* an empty value */
    CLI(&r, "put", path, "s", "empty", "");
    EXPECT_STATUS(&r, 0);
    CLI(&r, "get", path, "s", "empty");
    EXPECT_STATUS(&r, 0);
    assert_string_equal(r.out, "");
    /* rm: 0 removed, then 1 not there */
    CLI(&r, "rm", path, "s", "greeting");
    EXPECT_STATUS(&r, 0);
    CLI(&r, "rm", path, "s", "greeting");
    EXPECT_STATUS(&r, 1);
    CLI(&r, "get", path, "s", "greeting");
    EXPECT_STATUS(&r, 1);
    /* not a pool, no file, missing arguments: 2 */
    write_file(notpool, "just text\n", 10);
    CLI(&r, "get", notpool, "s", "k");
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "not an nvheap pool");
    CLI(&r, "put", notpool, "s", "k", "v");
    EXPECT_STATUS(&r, 2);
    CLI(&r, "rm", "/nonexistent/pool", "s", "k");
    EXPECT_STATUS(&r, 2);
    /* put --create on a missing pool file creates the pool (as nvh_kv_open
     * does); without --create, and for get and rm, a missing file is an error
     * and nothing is created */
    char fresh[512];
    fresh_path(fresh, sizeof fresh, "kvcmds.fresh");
    unlink(fresh);
    CLI(&r, "put", fresh, "s", "k", "v");
    EXPECT_STATUS(&r, 2);
    assert_false(exists(fresh));
    CLI(&r, "get", fresh, "s", "k");
    EXPECT_STATUS(&r, 2);
    assert_false(exists(fresh));
    CLI(&r, "put", fresh, "s", "k", "v", "--create");
    EXPECT_STATUS(&r, 0);
    assert_true(exists(fresh));
    CLI(&r, "get", fresh, "s", "k");
    EXPECT_STATUS(&r, 0);
    assert_string_equal(r.out, "v");
    unlink(fresh);
    CLI(&r, "get", path, "s");
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "missing KEY");
    CLI(&r, "put", path, "s", "k");
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "missing VALUE");
    unlink(path);
    unlink(in);
    unlink(notpool);
}

/* Random binary entries: every byte value, backslashes, newlines, empty
 * values, long keys. */
struct entry { unsigned char key[1100]; size_t klen; unsigned char value[300]; size_t vlen; };

static void random_entries(struct entry *e, size_t n, unsigned seed)
{
    srand(seed);
    for (size_t i = 0; i < n; i++) {
        e[i].klen = sizeof i + (size_t)rand() % (i % 50 == 0 ? 1024 : 24);
        e[i].vlen = i % 7 == 0 ? 0 : (size_t)rand() % 300;
        for (size_t j = 0; j < e[i].klen; j++) e[i].key[j] = (unsigned char)rand();
        for (size_t j = 0; j < e[i].vlen; j++) e[i].value[j] = (unsigned char)rand();
        if (i % 3 == 0) e[i].key[0] = '\\';      /* escapes next to each other */
        if (i % 5 == 0) e[i].key[e[i].klen - 1] = '\n';
        memcpy(e[i].key + 1, &i, sizeof i - 1);      /* distinct (n < 2^56) */
    }
}

/* The store holds exactly these entries. */
static void expect_store(const char *path, const char *name, const struct entry *e, size_t n)
{
    nvh_pool *pool = nvh_pool_open(path, NULL, NVH_OPEN_READONLY);
    assert_non_null(pool);
    nvh_kv_config c = {.name = name, .flags = NVH_KV_READONLY};
    nvh_kv *kv = nvh_kv_open_pool(pool, &c);
    if (!kv) fail_msg("store %s: %s", name, nvh_errormsg());
    uint64_t count = 0;
    assert_int_equal(nvh_kv_count_all(kv, &count), NVH_OK);
    assert_int_equal(count, n);
    static unsigned char buf[400];
    for (size_t i = 0; i < n; i++) {
        size_t vlen = 0;
        assert_int_equal(nvh_kv_get_copy(kv, e[i].key, e[i].klen, buf, sizeof buf, &vlen),
                         NVH_OK);
        assert_int_equal(vlen, e[i].vlen);
        assert_memory_equal(buf, e[i].value, vlen);
    }
    nvh_kv_close(kv);
    nvh_pool_close(pool);
}

static void fill_store(const char *path, const char *name, const char *engine,
                       const struct entry *e, size_t n)
{
    nvh_pool *pool = nvh_pool_open(path, NULL, 0);
    assert_non_null(pool);
    nvh_kv_config c = {.name = name, .engine = engine, .create = NVH_KV_CREATE_NEW};
    nvh_kv *kv = nvh_kv_open_pool(pool, &c);
    if (!kv) fail_msg("store %s: %s", name, nvh_errormsg());
    for (size_t i = 0; i < n; i++)
        assert_int_equal(nvh_kv_put(kv, e[i].key, e[i].klen, e[i].value, e[i].vlen), NVH_OK);
    assert_int_equal(nvh_kv_close(kv), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

static void dump_load_round_trip(void **state)
{
    (void)state;
    enum { N = 600 };
    static struct entry e[N];
    random_entries(e, N, 2026);
    char path[512], other[512], dump[512], dump2[512];
    fresh_path(path, sizeof path, "dump");
    fresh_path(other, sizeof other, "dump.other");
    fresh_path(dump, sizeof dump, "dump.txt");
    fresh_path(dump2, sizeof dump2, "dump2.txt");
    static const char *const engines[] = {"hash", "sorted"};
    for (unsigned k = 0; k < 2; k++) {
        unlink(path);
        unlink(other);
        create_pool(path, "32M", "kv");
        create_pool(other, "32M", "kv");
        if (!engine_available(path, engines[k])) continue;
        fill_store(path, "src", engines[k], e, N);
        for (int hex = 0; hex < 2; hex++) {
            struct run r;
            const char *argv[] = {cli_path(), "dump", path, "src", hex ? "--hex" : "--progress",
                                  NULL};
            run_argv_io(&r, argv, NULL, dump);
            EXPECT_STATUS(&r, 0);
            if (!hex) EXPECT_CONTAINS(r.err, "100%");     /* --progress draws the bar */
            size_t len = 0;
            unsigned char *text = test_read_file(dump, &len);
            /* a text file: one header line per key, no byte outside ' '..'~' but '\n' */
            for (size_t i = 0; i < len; i++)
                if (text[i] != '\n' && (text[i] < 0x20 || text[i] > 0x7e))
                    fail_msg("byte %#x at %zu of the dump", text[i], i);
            assert_memory_equal(text, "NVHEAP-DUMP=1\nformat=", 21);
            free(text);
            /* load into another pool (the store is created with the dump's engine)
             * and into the same pool under another name */
            const char *dst = hex ? "copy-hex" : "copy";
            const char *load1[] = {cli_path(), "load", other, dst, dump, NULL};
            run_argv_io(&r, load1, NULL, NULL);
            EXPECT_STATUS(&r, 0);
            EXPECT_CONTAINS(r.err, "loaded 600 entries");
            expect_store(other, dst, e, N);
            const char *load2[] = {cli_path(), "load", path, dst, NULL};   /* from stdin */
            run_argv_io(&r, load2, dump, NULL);
            EXPECT_STATUS(&r, 0);
            expect_store(path, dst, e, N);
            /* dump of the copy: the same entries (hash order may differ) */
            const char *again[] = {cli_path(), "dump", other, dst, hex ? "--hex" : "--no-progress",
                                   NULL};
            run_argv_io(&r, again, NULL, dump2);
            EXPECT_STATUS(&r, 0);
            assert_string_equal(r.err, "");
            CLI(&r, "ls", other);
            EXPECT_STATUS(&r, 0);
            EXPECT_CONTAINS(r.out, dst);
            EXPECT_CONTAINS(r.out, engines[k]);
        }
    }
    unlink(path);
    unlink(other);
    unlink(dump);
    unlink(dump2);
}

/* Load refuses bad input before it touches the pool: the file is unchanged. */
static void load_bad_input(void **state)
{
    (void)state;
    char path[512], dump[512], bad[512];
    fresh_path(path, sizeof path, "loadbad");
    fresh_path(dump, sizeof dump, "loadbad.txt");
    fresh_path(bad, sizeof bad, "loadbad.bad");
    create_pool(path, "16M", "kv");
    static struct entry e[40];
    random_entries(e, 40, 7);
    fill_store(path, "src", "hash", e, 40);
    struct run r;
    const char *argv[] = {cli_path(), "dump", path, "src", NULL};
    run_argv_io(&r, argv, NULL, dump);
    EXPECT_STATUS(&r, 0);
    size_t len = 0;
    char *text = (char *)test_read_file(dump, &len);
    char *data_end = strstr(text, "DATA=END\n");
    char *third = strchr(strchr(strchr(strstr(text, "HEADER=END\n"), '\n') + 1, '\n') + 1, '\n');
    assert_non_null(data_end);
    struct { const char *what; size_t cut; const char *insert; const char *message; } cases[] = {
        {"cut inside a line", (size_t)(third - text) - 3, NULL, "truncated"},
        {"cut before DATA=END", (size_t)(data_end - text), NULL, "truncated"},
        {"cut inside DATA=END", (size_t)(data_end - text) + 4, NULL, "truncated"},
        {"empty", 0, NULL, "not an nvheap dump"},
        {"header only", (size_t)(strstr(text, "HEADER=END") - text), NULL, "header"},
        {"bad escape", 0, "NVHEAP-DUMP=1\nformat=print\nentries=1\nHEADER=END\n k\\zz\n v\nDATA=END\n",
         "line 5"},
        {"odd hex", 0, "NVHEAP-DUMP=1\nformat=bytevalue\nentries=1\nHEADER=END\n 616\n 00\nDATA=END\n",
         "odd number"},
        {"count", 0, "NVHEAP-DUMP=1\nformat=print\nentries=2\nHEADER=END\n k\n v\nDATA=END\n",
         "says 2 entries"},
        {"no space", 0, "NVHEAP-DUMP=1\nformat=print\nentries=1\nHEADER=END\nk\n v\nDATA=END\n",
         "one space"},
        {"empty key", 0, "NVHEAP-DUMP=1\nformat=print\nentries=1\nHEADER=END\n \n v\nDATA=END\n",
         "key of 0 bytes"},
        {"trailing", 0, "NVHEAP-DUMP=1\nformat=print\nentries=0\nHEADER=END\nDATA=END\nx\n",
         "after DATA=END"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].insert) write_file(bad, cases[i].insert, strlen(cases[i].insert));
        else write_file(bad, text, cases[i].cut);
        struct fingerprint before = fingerprint(path);
        const char *load[] = {cli_path(), "load", path, "dst", bad, NULL};
        run_argv_io(&r, load, NULL, NULL);
        if (r.status != 2) fail_msg("%s: exit %d\n%s", cases[i].what, r.status, r.err);
        if (!strstr(r.err, cases[i].message) || !strstr(r.err, "nothing was loaded"))
            fail_msg("%s: message '%s' lacks '%s'", cases[i].what, r.err, cases[i].message);
        assert_unchanged(path, before);
    }
    /* missing store for dump, wrong pool, missing input file */
    CLI(&r, "dump", path, "nosuch");
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "no store 'nosuch'");
    CLI(&r, "load", dump, "dst", dump);
    EXPECT_STATUS(&r, 2);
    CLI(&r, "load", path, "dst", "/nonexistent/dump");
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "cannot open");
    CLI(&r, "ls", path);
    assert_null(strstr(r.out, "dst"));
    free(text);
    unlink(path);
    unlink(dump);
    unlink(bad);
}

/* ls lists every kind of thing a pool holds. */
static void ls_lists_everything(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "ls");
    create_pool(path, "16M", "kv");
    nvh_pool *pool = nvh_pool_open(path, NULL, 0);
    assert_non_null(pool);
    nvh_btree *t = nvh_btree_open(pool, "tree1", 1, NULL);
    assert_non_null(t);
    for (uint64_t k = 1; k <= 3; k++) assert_int_equal(nvh_btree_put(t, k, "abcd", 4), NVH_OK);
    nvh_btree_close(t);
    nvh_off_t *root = nvh_root(pool, NULL);
    assert_int_equal(nvh_hmap_create(pool, &root[0], NULL), NVH_OK);
    nvh_hmap *m = nvh_hmap_open(pool, root[0]);
    assert_non_null(m);
    assert_int_equal(nvh_hmap_put(m, "mk", 2, "mv", 2), NVH_OK);
    nvh_hmap_close(m);
    assert_non_null(nvh_reserve_named(pool, "my-object", 100));
    assert_int_equal(nvh_activate_named(pool, "my-object"), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    static struct entry e[5];
    random_entries(e, 5, 1);
    fill_store(path, "store1", "hash", e, 5);

    struct run r;
    CLI(&r, "ls", path);
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "KIND");
    const char *want[] = {"store", "store1", "tree", "tree1", "map", "object", "my-object"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) EXPECT_CONTAINS(r.out, want[i]);
    /* entries: 5 in the store, 3 in the tree, 1 in the bare map (the store's
     * own map is not listed apart) */
    const char *line = strstr(r.out, "tree1");
    assert_non_null(line);
    assert_true(strncmp(strstr(line, " 3 "), " 3 ", 3) == 0);
    assert_null(strstr(strstr(r.out, "map "), "\nmap "));   /* one map row */
    CLI(&r, "ls", path, "--json");
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "\"store1\": {");
    EXPECT_CONTAINS(r.out, "\"engine\": \"hash\"");
    EXPECT_CONTAINS(r.out, "\"entries\": 5");
    EXPECT_CONTAINS(r.out, "\"tree1\": {");
    EXPECT_CONTAINS(r.out, "\"my-object\": {");
    unlink(path);
}

/* stat (and ls) work while another process has the pool open read-write,
 * and do not keep it from closing and reopening; info (locked) is busy. */
static void stat_beside_writer(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "statlive");
    create_pool(path, "16M", "kv");
    int go[2], done[2];
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(done), 0);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(go[0]);
        close(done[1]);
        nvh_pool *pool = nvh_pool_open(path, NULL, 0);
        nvh_kv_config c = {.name = "live", .engine = "hash", .create = NVH_KV_CREATE_NEW};
        nvh_kv *kv = pool ? nvh_kv_open_pool(pool, &c) : NULL;
        if (!kv) _exit(3);
        for (unsigned i = 0; i < 100; i++) {
            char k[16];
            snprintf(k, sizeof k, "key%u", i);
            if (nvh_kv_put(kv, k, strlen(k), "value", 5) != NVH_OK) _exit(4);
        }
        if (write(go[1], "x", 1) != 1) _exit(5);
        char b;
        (void)!read(done[0], &b, 1);    /* hold the pool open until told */
        _exit(nvh_kv_close(kv) == NVH_OK && nvh_pool_close(pool) == NVH_OK ? 0 : 6);
    }
    close(go[1]);
    close(done[0]);
    char b;
    assert_int_equal(read(go[0], &b, 1), 1);
    struct run r;
    CLI(&r, "stat", path);
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "live:");
    EXPECT_CONTAINS(r.out, "entries: 100");
    assert_string_equal(str_of(r.out, "closed-cleanly"), "no");
    EXPECT_CONTAINS(r.out, "live-objects:");
    CLI(&r, "stat", path, "--json");
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "\"entries\": 100");
    CLI(&r, "ls", path);
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "live");
    CLI(&r, "info", path);            /* the locked read-only open is refused */
    EXPECT_STATUS(&r, 2);
    EXPECT_CONTAINS(r.err, "in use");
    CLI(&r, "get", path, "live", "key1");
    EXPECT_STATUS(&r, 2);
    assert_int_equal(write(done[1], "x", 1), 1);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    CLI(&r, "stat", path);
    EXPECT_STATUS(&r, 0);
    assert_string_equal(str_of(r.out, "closed-cleanly"), "yes");
    CLI(&r, "get", path, "live", "key99");
    EXPECT_STATUS(&r, 0);
    assert_string_equal(r.out, "value");
    close(go[0]);
    close(done[1]);
    unlink(path);
}

/* ==========================================================================
 * hello_pool, the first example
 * ========================================================================== */
static void hello_pool_twice(void **state)
{
    (void)state;
    char path[512];
    fresh_path(path, sizeof path, "hello");
    struct run r;
    HELLO(&r, path);
    EXPECT_STATUS(&r, 0);
    EXPECT_CONTAINS(r.out, "creating");
    EXPECT_CONTAINS(r.out, "wrote record: counter 1,");
    EXPECT_CONTAINS(r.out, "counter 1, message \"hello #1 from pid");
    EXPECT_CONTAINS(r.out, "verified");
    HELLO(&r, path);
    EXPECT_STATUS(&r, 0);
    assert_null(strstr(r.out, "creating"));
    EXPECT_CONTAINS(r.out, "wrote record: counter 2,");
    EXPECT_CONTAINS(r.out, "message \"hello #2 from pid");
    EXPECT_CONTAINS(r.out, "verified");

    CLI(&r, "check", path, "--layout", "hello_pool");
    EXPECT_STATUS(&r, 0);
    CLI(&r, "info", path);
    EXPECT_STATUS(&r, 0);
    assert_string_equal(str_of(r.out, "layout"), "hello_pool");
    assert_int_equal(u64_of(r.out, "epoch"), 4);   /* two opens per run */
    unlink(path);

    create_pool(path, "1M", "not-hello");          /* someone else's pool */
    HELLO(&r, path);
    assert_int_not_equal(r.status, 0);
    EXPECT_CONTAINS(r.err, "layout");
    unlink(path);
}

int main(void)
{
    /* The tool's behaviour under test must not depend on the caller's
     * environment (a CI matrix may force a domain). */
    unsetenv("NVHEAP_DOMAIN");
    unsetenv("NVHEAP_MAX_SIZE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(help_everywhere),
        cmocka_unit_test(usage_errors),
        cmocka_unit_test(create_then_info),
        cmocka_unit_test(create_refuses_existing),
        cmocka_unit_test(size_suffixes),
        cmocka_unit_test(bad_sizes_rejected),
        cmocka_unit_test(info_json),
        cmocka_unit_test(info_stats),
        cmocka_unit_test(read_only_commands_never_modify),
        cmocka_unit_test(check_good_pool),
        cmocka_unit_test(check_corrupt_header),
        cmocka_unit_test(check_state_slots),
        cmocka_unit_test(check_truncated),
        cmocka_unit_test(check_heap_corruption),
        cmocka_unit_test(check_cannot_check),
        cmocka_unit_test(help_text_accurate),
        cmocka_unit_test(fifo_is_not_a_pool),
        cmocka_unit_test(check_reports_containers),
        cmocka_unit_test(repair_salvages_tree),
        cmocka_unit_test(repair_keeps_tree_over_bad_region),
        cmocka_unit_test(repair_salvages_map),
        cmocka_unit_test(check_crashed_pool),
        cmocka_unit_test(hello_pool_twice),
        cmocka_unit_test(kv_get_put_rm),
        cmocka_unit_test(dump_load_round_trip),
        cmocka_unit_test(load_bad_input),
        cmocka_unit_test(ls_lists_everything),
        cmocka_unit_test(stat_beside_writer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
