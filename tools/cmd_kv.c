/* cmd_kv.c — the key-value store commands: `nvheap dump` / `nvheap load`
 * (the roles of mdb_dump / mdb_load, in the format of kv_text.c) and
 * `nvheap get` / `put` / `rm` for scripts. docs/CLI.md documents them.
 *
 * dump and get open the pool read-only (shared lock: a read-write open
 * elsewhere makes them fail busy, so what they read is consistent); load,
 * put and rm open it read-write, and every write is durable when the
 * command exits 0. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The store of a pool; NULL (reported) if the pool or store cannot be
 * opened. *pool_out is the pool to close after the store, or NULL when the
 * store owns it: with create, a missing pool file is created as
 * nvh_kv_open creates one (layout "nvkv", 64 MiB, growing), as a user of
 * `put --create` expects from pmemkv or LMDB. */
static nvh_kv *open_store(const char *path, const char *store, bool write, nvh_kv_create create,
                          const char *engine, nvh_pool **pool_out)
{
    nvh_pool *pool = nvh_pool_open(path, NULL, write ? 0 : NVH_OPEN_READONLY);
    if (!pool && nvh_errcode() == NVH_E_NOENT && write && create != NVH_KV_OPEN_EXISTING) {
        nvh_kv_config c = {.path = path, .name = store, .create = create, .engine = engine};
        nvh_kv *kv = nvh_kv_open(&c);
        if (!kv) {
            fail_msg("%s: %s", path, nvh_errormsg());
            return NULL;
        }
        *pool_out = NULL;
        return kv;
    }
    if (!pool) {
        fail_lib();
        return NULL;
    }
    nvh_kv_config c = {.name = store, .create = create, .engine = engine,
                       .flags = write ? 0 : NVH_KV_READONLY};
    nvh_kv *kv = nvh_kv_open_pool(pool, &c);
    if (!kv) {
        fail_msg("%s: %s", path, nvh_errormsg());
        nvh_pool_close(pool);
        return NULL;
    }
    *pool_out = pool;
    return kv;
}

/* Close store and pool; EXIT_ERROR (reported) if either fails. */
static int close_store(nvh_kv *kv, nvh_pool *pool, int status)
{
    if (nvh_kv_close(kv) != NVH_OK && status != EXIT_ERROR) status = fail_lib();
    if (pool && nvh_pool_close(pool) != NVH_OK && status != EXIT_ERROR) status = fail_lib();
    return status;
}

/* All of fd into b (a file, a pipe, a terminal). 0 or an errno. */
static int read_all(int fd, struct kvt_buf *b)
{
    struct stat st;
    size_t want = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? (size_t)st.st_size + 1 : 65536;
    b->len = 0;
    for (;;) {
        if (b->cap - b->len < 4096) {
            size_t cap = b->cap ? b->cap * 2 : want;
            if (cap < b->len + 4096) cap = b->len + 4096;
            unsigned char *p = realloc(b->p, cap);
            if (!p) return ENOMEM;
            b->p = p;
            b->cap = cap;
        }
        ssize_t n = read(fd, b->p + b->len, b->cap - b->len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno;
        if (n == 0) return 0;
        b->len += (size_t)n;
    }
}

/* KEY (or VALUE) from the command line: raw bytes, or hex with --hex. */
static bool arg_bytes(const struct args *args, const char *text, const char *what,
                      struct kvt_buf *out)
{
    if (args->given[OPT_HEX]) {
        size_t len = strlen(text);
        while (len && (text[len - 1] == '\n' || text[len - 1] == ' ')) len--;
        if (kvt_decode_hex(text, len, out) != 0) {
            kvt_buf_free(out);
            fail_msg("%s is not hex (two digits 0-9a-f per byte): '%.40s'", what, text);
            return false;
        }
        return true;
    }
    size_t len = strlen(text);
    out->p = malloc(len + 1);
    if (!out->p) {
        fail_msg("out of memory");
        return false;
    }
    memcpy(out->p, text, len);
    out->len = out->cap = len;
    return true;
}

/* ==========================================================================
 * dump
 * ========================================================================== */
struct dump_ctx {
    FILE *out;
    bool hex;
    int err;            /* errno of a failed write */
    uint64_t done;
    struct progress progress;
};

static int dump_entry(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    struct dump_ctx *d = arg;
    if (kvt_write_data(d->out, d->hex, k, kl) != 0 || kvt_write_data(d->out, d->hex, v, vl) != 0) {
        d->err = errno ? errno : EIO;
        return 1;      /* stop the scan */
    }
    progress_step(&d->progress, ++d->done);
    return 0;
}

int run_dump(const struct args *args)
{
    nvh_pool *pool;
    nvh_kv *kv = open_store(args->path, args->arg[1], false, NVH_KV_OPEN_EXISTING, NULL, &pool);
    if (!kv) return EXIT_ERROR;
    int status = EXIT_OK;
    struct kvt_header h = {.hex = args->given[OPT_HEX]};
    snprintf(h.engine, sizeof h.engine, "%s", nvh_kv_engine(kv));
    snprintf(h.store, sizeof h.store, "%s", args->arg[1]);
    if (nvh_kv_count_all(kv, &h.entries) != NVH_OK) {
        status = fail_lib();
        goto out;
    }
    struct dump_ctx d = {.out = stdout, .hex = h.hex};
    progress_start(&d.progress, "dump", h.entries, args);
    if (kvt_write_header(stdout, &h) != 0) {
        status = fail_msg("cannot write the dump: %s", strerror(errno));
        goto out;
    }
    int rc = nvh_kv_get_all(kv, dump_entry, &d);
    progress_end(&d.progress);
    if (d.err) {
        status = fail_msg("cannot write the dump: %s", strerror(d.err));
    } else if (rc != NVH_OK) {
        status = fail_lib();
    } else if (d.done != h.entries) {
        /* the header promised a count: a different one would make load refuse */
        status = fail_msg("store '%s' changed during the dump (%llu entries counted, %llu "
                          "written)", args->arg[1], (unsigned long long)h.entries,
                          (unsigned long long)d.done);
    } else if (kvt_write_end(stdout) != 0 || fflush(stdout) != 0) {
        status = fail_msg("cannot write the dump: %s", strerror(errno));
    }
out:
    return close_store(kv, pool, status);
}

/* ==========================================================================
 * load: read and check everything, then apply
 * ========================================================================== */
struct loaded {
    char *text;
    size_t len;
    struct kvt_header h;
    uint64_t entries;
};

/* Read the input and check all of it: 0, or EXIT_ERROR (reported). */
static int load_parse(const struct args *args, struct loaded *l)
{
    const char *file = args->nargs > 2 ? args->arg[2] : NULL;
    const char *label = file && strcmp(file, "-") != 0 ? file : "stdin";
    int fd = 0;
    if (file && strcmp(file, "-") != 0) {
        fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return fail_msg("cannot open %s: %s", file, strerror(errno));
    }
    struct kvt_buf b = {0};
    int err = read_all(fd, &b);
    if (fd > 0) close(fd);
    if (err) {
        kvt_buf_free(&b);
        return fail_msg("cannot read %s: %s", label, strerror(err));
    }
    l->text = (char *)b.p;
    l->len = b.len;
    struct kvt_reader r;
    kvt_reader_init(&r, l->text, l->len);
    struct kvt_buf key = {0}, value = {0};
    int rc = kvt_read_header(&r, &l->h);
    uint64_t n = 0;
    while (rc == 0) {
        int e = kvt_read_entry(&r, &key, &value);
        if (e < 0) {
            rc = -1;
        } else if (e == 0) {
            break;
        } else if (key.len == 0 || key.len > NVH_KV_KEY_MAX) {
            rc = -1;
            snprintf(r.error, sizeof r.error, "line %llu: key of %zu bytes (1..%u allowed)",
                     (unsigned long long)r.line - 1, key.len, NVH_KV_KEY_MAX);
        } else if (value.len > NVH_KV_VALUE_MAX) {
            rc = -1;
            snprintf(r.error, sizeof r.error, "line %llu: value of %zu bytes (at most %zu)",
                     (unsigned long long)r.line, value.len, (size_t)NVH_KV_VALUE_MAX);
        } else {
            n++;
        }
    }
    kvt_buf_free(&key);
    kvt_buf_free(&value);
    if (rc == 0 && n != l->h.entries) {
        rc = -1;
        snprintf(r.error, sizeof r.error, "the header says %llu entries, the data holds %llu "
                 "(truncated or edited dump)", (unsigned long long)l->h.entries,
                 (unsigned long long)n);
    }
    if (rc != 0) {
        free(l->text);
        l->text = NULL;
        return fail_msg("%s: %s; nothing was loaded", label, r.error);
    }
    l->entries = n;
    return EXIT_OK;
}

static bool store_exists(nvh_pool *pool, const char *name)
{
    nvh_kv_config c = {.name = name, .flags = NVH_KV_READONLY};
    nvh_kv *kv = nvh_kv_open_pool(pool, &c);
    if (kv) nvh_kv_close(kv);
    return kv != NULL;
}

int run_load(const struct args *args)
{
    const char *store = args->arg[1];
    struct loaded l = {0};
    if (load_parse(args, &l) != EXIT_OK) return EXIT_ERROR;
    const char *engine = args->given[OPT_ENGINE] ? args->value[OPT_ENGINE]
                         : l.h.engine[0]                   ? l.h.engine : NULL;
    nvh_pool *pool = nvh_pool_open(args->path, NULL, 0);
    if (!pool) {
        free(l.text);
        return fail_lib();
    }
    bool created = !store_exists(pool, store);
    nvh_kv_config c = {.name = store, .engine = created ? engine : NULL,
                       .create = created ? NVH_KV_CREATE_NEW : NVH_KV_OPEN_EXISTING};
    nvh_kv *kv = nvh_kv_open_pool(pool, &c);
    if (!kv) {
        int status = fail_msg("%s: %s", args->path, nvh_errormsg());
        nvh_pool_close(pool);
        free(l.text);
        return status;
    }
    struct kvt_reader r;
    kvt_reader_init(&r, l.text, l.len);
    struct kvt_header h;
    kvt_read_header(&r, &h);               /* checked by load_parse */
    struct kvt_buf key = {0}, value = {0};
    struct progress p;
    progress_start(&p, "load", l.entries, args);
    uint64_t done = 0;
    int rc = NVH_OK;
    while (kvt_read_entry(&r, &key, &value) == 1) {
        rc = nvh_kv_put(kv, key.p, key.len, value.p, value.len);
        if (rc != NVH_OK) break;
        progress_step(&p, ++done);
    }
    progress_end(&p);
    int status = EXIT_OK;
    if (rc != NVH_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", nvh_errormsg());
        nvh_kv_close(kv);
        kv = NULL;
        /* a store this load created goes again: nothing changed */
        if (created && nvh_kv_drop(pool, store) == NVH_OK)
            status = fail_msg("%s: entry %llu of %llu: %s; the store '%s' this load created "
                              "was removed again", args->path, (unsigned long long)done + 1,
                              (unsigned long long)l.entries, why, store);
        else
            status = fail_msg("%s: entry %llu of %llu: %s; the first %llu entries are in "
                              "store '%s'", args->path, (unsigned long long)done + 1,
                              (unsigned long long)l.entries, why, (unsigned long long)done,
                              store);
    }
    kvt_buf_free(&key);
    kvt_buf_free(&value);
    free(l.text);
    if (kv && nvh_kv_close(kv) != NVH_OK && status == EXIT_OK) status = fail_lib();
    if (nvh_pool_close(pool) != NVH_OK && status == EXIT_OK) status = fail_lib();
    if (status == EXIT_OK)
        fprintf(stderr, "nvheap: loaded %llu entries into store '%s'%s\n",
                (unsigned long long)done, store, created ? " (created)" : "");
    return status;
}

/* ==========================================================================
 * get / put / rm
 * ========================================================================== */
struct get_ctx {
    bool hex;
    int err;
};

static int print_value(const void *value, size_t vlen, void *arg)
{
    struct get_ctx *g = arg;
    int rc = g->hex ? kvt_write_data(stdout, true, value, vlen)
                    : (fwrite(value, 1, vlen, stdout) == vlen ? 0 : -1);
    if (rc != 0) g->err = errno ? errno : EIO;
    return 0;
}

int run_get(const struct args *args)
{
    struct kvt_buf key = {0};
    if (!arg_bytes(args, args->arg[2], "KEY", &key)) return EXIT_ERROR;
    nvh_pool *pool;
    nvh_kv *kv = open_store(args->path, args->arg[1], false, NVH_KV_OPEN_EXISTING, NULL, &pool);
    if (!kv) {
        kvt_buf_free(&key);
        return EXIT_ERROR;
    }
    struct get_ctx g = {.hex = args->given[OPT_HEX]};
    int status = EXIT_OK;
    /* the value is written to stdout straight from the pool (zero-copy) */
    int rc = nvh_kv_get(kv, key.p, key.len, print_value, &g);
    if (rc == NVH_E_NOTFOUND)
        status = EXIT_NOTFOUND;
    else if (rc != NVH_OK)
        status = fail_lib();
    else if (g.err || fflush(stdout) != 0)
        status = fail_msg("cannot write the value: %s", strerror(g.err ? g.err : errno));
    if (status == EXIT_NOTFOUND)
        fprintf(stderr, "nvheap: no such key in store '%s'\n", args->arg[1]);
    kvt_buf_free(&key);
    return close_store(kv, pool, status);
}

int run_put(const struct args *args)
{
    if (args->given[OPT_ENGINE] && !args->given[OPT_CREATE])
        return usage_error(args->command, "--engine needs --create");
    struct kvt_buf key = {0}, value = {0};
    int status = EXIT_OK;
    if (!arg_bytes(args, args->arg[2], "KEY", &key)) return EXIT_ERROR;
    if (strcmp(args->arg[3], "-") == 0) {
        int err = read_all(0, &value);
        if (err) status = fail_msg("cannot read the value from stdin: %s", strerror(err));
        if (!err && args->given[OPT_HEX]) {
            struct kvt_buf raw = value;
            size_t len = raw.len;
            while (len && (raw.p[len - 1] == '\n' || raw.p[len - 1] == ' ')) len--;
            value = (struct kvt_buf){0};
            if (kvt_decode_hex((const char *)raw.p, len, &value) != 0)
                status = fail_msg("VALUE on stdin is not hex (two digits 0-9a-f per byte)");
            kvt_buf_free(&raw);
        }
    } else if (!arg_bytes(args, args->arg[3], "VALUE", &value)) {
        status = EXIT_ERROR;
    }
    if (status != EXIT_OK) goto out;
    nvh_pool *pool;
    nvh_kv *kv = open_store(args->path, args->arg[1], true,
                            args->given[OPT_CREATE] ? NVH_KV_CREATE_IF_MISSING
                                                    : NVH_KV_OPEN_EXISTING,
                            args->value[OPT_ENGINE], &pool);
    if (!kv) {
        status = EXIT_ERROR;
        goto out;
    }
    if (nvh_kv_put(kv, key.p, key.len, value.p ? value.p : (unsigned char *)"", value.len) != NVH_OK)
        status = fail_lib();
    status = close_store(kv, pool, status);
out:
    kvt_buf_free(&key);
    kvt_buf_free(&value);
    return status;
}

int run_rm(const struct args *args)
{
    struct kvt_buf key = {0};
    if (!arg_bytes(args, args->arg[2], "KEY", &key)) return EXIT_ERROR;
    nvh_pool *pool;
    nvh_kv *kv = open_store(args->path, args->arg[1], true, NVH_KV_OPEN_EXISTING, NULL, &pool);
    if (!kv) {
        kvt_buf_free(&key);
        return EXIT_ERROR;
    }
    int status = EXIT_OK;
    int rc = nvh_kv_remove(kv, key.p, key.len);
    if (rc == NVH_E_NOTFOUND) {
        status = EXIT_NOTFOUND;
        fprintf(stderr, "nvheap: no such key in store '%s'\n", args->arg[1]);
    } else if (rc != NVH_OK) {
        status = fail_lib();
    }
    kvt_buf_free(&key);
    return close_store(kv, pool, status);
}
