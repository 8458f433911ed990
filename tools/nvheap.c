/* nvheap.c — the `nvheap` command-line tool: create a pool, print the facts
 * about one, and verify one offline;
 *
 *   nvheap create PATH --size SIZE [options]   new pool file (never overwrites)
 *   nvheap info PATH [options]                 facts about a pool (read-only)
 *   nvheap check PATH [options]                offline consistency check
 *
 * and the table of every command (cmd_stat.c: ls, stat; cmd_kv.c: dump,
 * load, get, put, rm), the command-line parser, and main.
 *
 * Every command, option, output key and exit code is documented in
 * docs/CLI.md. Exit status: 0 success (check: consistent), 1 check found the
 * pool inconsistent, 2 any error (usage, missing file, not a pool, busy...).
 *
 * Extending: `info` prints the sections of the info_providers[] table and
 * `check` runs the checkers[] table in order. A later layer (the allocator's
 * per-class usage, its heap scan) adds one function and one table row. */
#include "cli.h"
/* Internal headers, for `check` only (tools sit above every layer, so the
 * layer rule allows them): */
#include "pool/format.h"       /* superblock layout and its checksums, read offline */
#include "ds/btree.h"          /* B+ tree header (emptied by `check --repair`) */
#include "ds/hashmap.h"        /* hash-map root (found by `check`), salvage */

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


/* ==========================================================================
 * Command line: commands, options, parsing, help
 * ========================================================================== */
static const struct option_def {
    const char *name;       /* long name, without "--" */
    bool takes_value;
} option_defs[OPT_COUNT_] = {
    [OPT_HELP] = {"help", false},
    [OPT_SIZE] = {"size", true},
    [OPT_LAYOUT] = {"layout", true},
    [OPT_DOMAIN] = {"domain", true},
    [OPT_ROOT_SIZE] = {"root-size", true},
    [OPT_MAX_SIZE] = {"max-size", true},
    [OPT_SPARSE] = {"sparse", false},
    [OPT_STATS] = {"stats", false},
    [OPT_JSON] = {"json", false},
    [OPT_RW] = {"rw", false},
    [OPT_REPAIR] = {"repair", false},
    [OPT_NO_BACKUP] = {"no-backup", false},
    [OPT_HEX] = {"hex", false},
    [OPT_ENGINE] = {"engine", true},
    [OPT_CREATE] = {"create", false},
    [OPT_PROGRESS] = {"progress", false},
    [OPT_NO_PROGRESS] = {"no-progress", false},
};

static int run_create(const struct args *args);
static int run_info(const struct args *args);
static int run_check(const struct args *args);

static const struct command commands[] = {
    {"create", "create PATH --size SIZE [--layout NAME] [--domain D] [--root-size SIZE] "
               "[--max-size SIZE] [--sparse]",
     "create a new pool file (never overwrites an existing file)",
     "  --size SIZE        pool size (at least 1 MiB; rounded up to 4 KiB)\n"
     "  --layout NAME      layout name that opens must match (at most 63 bytes)\n"
     "  --domain D         persistence domain: pmem, eadr, msync, process, sim or\n"
     "                     auto (default: NVHEAP_DOMAIN, else detected); recorded\n"
     "                     as the pool's created domain\n"
     "  --root-size SIZE   root area size (default 4K; rounded up to 4 KiB; max 1G)\n"
     "  --max-size SIZE    growth limit, recorded in the pool (later opens keep it\n"
     "                     unless NVHEAP_MAX_SIZE is set; default 64 GiB)\n"
     "  --sparse           do not allocate the file's space up front\n",
     NULL,
     OPT_BIT(OPT_SIZE) | OPT_BIT(OPT_LAYOUT) | OPT_BIT(OPT_DOMAIN) | OPT_BIT(OPT_ROOT_SIZE) |
         OPT_BIT(OPT_MAX_SIZE) | OPT_BIT(OPT_SPARSE),
     run_create, NULL, 0, 0},
    {"info", "info PATH [--stats] [--json] [--layout NAME] [--domain D] [--rw]",
     "print the facts about a pool (read-only: never modifies the file)",
     "  --stats            add the statistics sections (persistence counters of\n"
     "                     this open)\n"
     "  --json             print one JSON object with the same keys\n"
     "  --layout NAME      refuse a pool of another layout\n"
     "  --domain D         domain to open in (default: NVHEAP_DOMAIN, else detected)\n"
     "  --rw               open read-write like an application does: bumps the\n"
     "                     epoch (the file changes); with --stats the counters show\n"
     "                     what that open cost in this domain\n",
     NULL,
     OPT_BIT(OPT_STATS) | OPT_BIT(OPT_JSON) | OPT_BIT(OPT_LAYOUT) | OPT_BIT(OPT_DOMAIN) |
         OPT_BIT(OPT_RW),
     run_info, NULL, 0, 0},
    {"check", "check PATH [--layout NAME] [--repair [--no-backup]]",
     "verify a pool offline: superblock, heap region headers, every B+ tree and "
     "hash map",
     "  --layout NAME      refuse a pool of another layout\n"
     "  --repair           if the check finds errors: back the pool up to\n"
     "                     PATH.bak, quarantine corrupt heap regions, rebuild\n"
     "                     damaged B+ trees from their readable keys, cut damaged\n"
     "                     hash-map links past the damage; print what was\n"
     "                     removed, then check again (the file changes). Without\n"
     "                     it check never modifies the file\n"
     "  --no-backup        with --repair: do not write PATH.bak first\n",
     "Prints one finding per line (error/warning/note, byte offset, what is wrong),\n"
     "then a summary. Exit status: 0 consistent (warnings allowed; with --repair:\n"
     "consistent after the repair), 1 inconsistent, 2 could not check (missing\n"
     "file, not a pool, pool in use, backup failed, ...).\n",
     OPT_BIT(OPT_LAYOUT) | OPT_BIT(OPT_REPAIR) | OPT_BIT(OPT_NO_BACKUP),
     run_check, NULL, 0, 0},
    {"ls", "ls PATH [--json]",
     "list a pool's key-value stores, B+ trees, hash maps and named objects, "
     "with their kind, entry counts and sizes (read-only)",
     "  --json             print one JSON object\n",
     "Opens the pool read-only without a lock (NVH_OPEN_SHARED): works while an\n"
     "application has the pool open, and shows the live contents.\n",
     OPT_BIT(OPT_JSON), run_ls, NULL, 0, 0},
    {"stat", "stat PATH [--json]",
     "print allocator and store statistics (read-only; works while another "
     "process has the pool open)",
     "  --json             print one JSON object with the same keys\n",
     "Opens the pool read-only without a lock (NVH_OPEN_SHARED), as mdb_stat\n"
     "reads a live LMDB: a writer elsewhere is neither blocked nor blocks it.\n"
     "If a walk meets another process's update half done, it is retried.\n",
     OPT_BIT(OPT_JSON), run_stat, NULL, 0, 0},
    {"dump", "dump PATH STORE [--hex] [--progress | --no-progress]",
     "write every entry of a key-value store to stdout in the dump format "
     "(docs/CLI.md)",
     "  --hex              every key and value in hex (format=bytevalue);\n"
     "                     default: printable bytes as they are, others as \\xx\n"
     "  --progress         draw the progress bar on stderr even if it is not a\n"
     "                     terminal; --no-progress: never (default: on a terminal)\n",
     NULL,
     OPT_BIT(OPT_HEX) | OPT_BIT(OPT_PROGRESS) | OPT_BIT(OPT_NO_PROGRESS), run_dump,
     "PATH STORE", 2, 2},
    {"load", "load PATH STORE [FILE] [--engine E] [--progress | --no-progress]",
     "put the entries of a dump (FILE, or stdin) into a store, creating it if "
     "missing",
     "  --engine E         engine of a store created by the load: sorted or\n"
     "                     hash (default: the dump header's engine)\n"
     "  --progress         draw the progress bar on stderr even if it is not a\n"
     "                     terminal; --no-progress: never (default: on a terminal)\n",
     "The whole input is read and checked before the store is touched: a\n"
     "truncated or malformed dump changes nothing. Entries overwrite existing\n"
     "keys. If applying fails part way (pool full), a store the load created is\n"
     "dropped again; an existing store keeps the entries put so far (the message\n"
     "says how many).\n",
     OPT_BIT(OPT_ENGINE) | OPT_BIT(OPT_PROGRESS) | OPT_BIT(OPT_NO_PROGRESS), run_load,
     "PATH STORE FILE", 2, 3},
    {"get", "get PATH STORE KEY [--hex]",
     "print the value of KEY (raw bytes, no newline); exit 1 if absent",
     "  --hex              KEY is hex, and the value is printed in hex + newline\n",
     "Exit status: 0 found, 1 no such key, 2 error (no pool, no store, ...).\n",
     OPT_BIT(OPT_HEX), run_get, "PATH STORE KEY", 3, 3},
    {"put", "put PATH STORE KEY VALUE [--hex] [--create [--engine E]]",
     "set KEY to VALUE (VALUE '-': read it from stdin); durable on exit",
     "  --hex              KEY and VALUE are hex (stdin too)\n"
     "  --create           create the store if it does not exist\n"
     "  --engine E         with --create: sorted (default) or hash\n",
     "Exit status: 0 stored, 2 error (no pool, no store without --create, ...).\n",
     OPT_BIT(OPT_HEX) | OPT_BIT(OPT_CREATE) | OPT_BIT(OPT_ENGINE), run_put,
     "PATH STORE KEY VALUE", 4, 4},
    {"rm", "rm PATH STORE KEY [--hex]",
     "remove KEY; exit 1 if it was not there",
     "  --hex              KEY is hex\n",
     "Exit status: 0 removed, 1 no such key, 2 error.\n",
     OPT_BIT(OPT_HEX), run_rm, "PATH STORE KEY", 3, 3},
};
#define COMMAND_COUNT (sizeof commands / sizeof commands[0])

static void print_usage(FILE *out)
{
    fprintf(out, "usage: nvheap COMMAND PATH [ARGS] [OPTIONS]\n\nCommands:\n");
    for (size_t i = 0; i < COMMAND_COUNT; i++)
        fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "  %-8s %s\n", "help", "print this help, or a command's (nvheap help info)");
    fprintf(out,
            "\nOptions:\n"
            "  -h, --help   print help (also after a command: nvheap info --help)\n"
            "  --version    print the version\n"
            "\nSIZE: bytes, or a number with a binary suffix K, M, G or T (any case,\n"
            "optionally followed by B or iB): 1048576, 64M, 1g, 512KiB.\n"
            "Exit status: 0 success, 1 check found the pool inconsistent or get/rm\n"
            "found no such key, 2 error.\n"
            "Documentation: docs/CLI.md\n");
}

static void print_command_help(const struct command *cmd, FILE *out)
{
    fprintf(out, "usage: nvheap %s\n\n%s.\n\nOptions:\n%s", cmd->synopsis, cmd->summary,
            cmd->details);
    fprintf(out, "  -h, --help         print this help\n");
    if (cmd->notes) fprintf(out, "\n%s", cmd->notes);
}

/* A usage error: message, the command's synopsis, exit 2. */
int usage_error(const struct command *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cli_vmessage(fmt, ap);
    va_end(ap);
    if (cmd)
        fprintf(stderr, "usage: nvheap %s\nTry 'nvheap %s --help'.\n", cmd->synopsis,
                cmd->name);
    else
        print_usage(stderr);
    return EXIT_ERROR;
}

static const struct command *find_command(const char *name)
{
    for (size_t i = 0; i < COMMAND_COUNT; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

/* Parse a command's arguments: one PATH and the options the command accepts,
 * as "--name value" or "--name=value", in any order; "--" ends the options.
 * Returns EXIT_OK or a usage error (already printed). */
static int parse_args(const struct command *cmd, int argc, char **argv, struct args *args)
{
    memset(args, 0, sizeof *args);
    args->command = cmd;
    bool options_done = false;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!options_done && strcmp(arg, "--") == 0) {
            options_done = true;
            continue;
        }
        if (!options_done && strcmp(arg, "-h") == 0) {
            args->given[OPT_HELP] = true;
            continue;
        }
        if (!options_done && arg[0] == '-' && arg[1] != '\0') {
            if (arg[1] != '-') return usage_error(cmd, "unknown option '%s'", arg);
            const char *name = arg + 2;
            const char *eq = strchr(name, '=');
            size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
            int id = -1;
            for (int o = 0; o < OPT_COUNT_; o++)
                if (strlen(option_defs[o].name) == name_len &&
                    strncmp(option_defs[o].name, name, name_len) == 0 &&
                    (o == OPT_HELP || (cmd->options & OPT_BIT(o))))
                    id = o;
            if (id < 0) return usage_error(cmd, "unknown option '%s' for '%s'", arg, cmd->name);
            if (option_defs[id].takes_value) {
                if (eq) {
                    args->value[id] = eq + 1;
                } else if (i + 1 < argc) {
                    args->value[id] = argv[++i];
                } else {
                    return usage_error(cmd, "option '--%s' needs a value", option_defs[id].name);
                }
            } else if (eq) {
                return usage_error(cmd, "option '--%s' takes no value", option_defs[id].name);
            }
            args->given[id] = true;
            continue;
        }
        unsigned max = cmd->max_args ? cmd->max_args : 1;
        if (args->nargs >= max) return usage_error(cmd, "unexpected argument '%s'", arg);
        args->arg[args->nargs++] = arg;
    }
    args->path = args->arg[0];
    unsigned min = cmd->min_args ? cmd->min_args : 1;
    if (!args->given[OPT_HELP] && args->nargs < min) {
        /* name the first missing one: the nargs-th word of arg_names */
        const char *names = cmd->arg_names ? cmd->arg_names : "PATH";
        for (unsigned i = 0; i < args->nargs && names; i++) {
            names = strchr(names, ' ');
            if (names) names++;
        }
        if (!names) names = "argument";
        return usage_error(cmd, "missing %.*s", (int)strcspn(names, " "), names);
    }
    return EXIT_OK;
}

/* --domain NAME into create/open flags (0 = auto). */
bool parse_domain(const struct args *args, unsigned *flags)
{
    nvh_domain domain = NVH_DOMAIN_AUTO;
    if (args->given[OPT_DOMAIN] && nvh_domain_parse(args->value[OPT_DOMAIN], &domain) != NVH_OK) {
        fail_lib();
        return false;
    }
    *flags |= (unsigned)domain;
    return true;
}

/* ==========================================================================
 * create
 * ========================================================================== */
static int run_create(const struct args *args)
{
    if (!args->given[OPT_SIZE]) return usage_error(args->command, "--size is required");
    uint64_t size;
    nvh_pool_options options = {0};
    unsigned flags = args->given[OPT_SPARSE] ? NVH_CREATE_NOFALLOCATE : 0;
    if (!parse_size(args->value[OPT_SIZE], "--size", &size)) return EXIT_ERROR;
    /* The library reads 0 as "default": refuse it rather than silently
     * giving the user something else than asked. */
    if (args->given[OPT_ROOT_SIZE]) {
        if (!parse_size(args->value[OPT_ROOT_SIZE], "--root-size", &options.root_size))
            return EXIT_ERROR;
        if (options.root_size == 0) return fail_msg("--root-size must be at least 1 byte");
    }
    if (args->given[OPT_MAX_SIZE]) {
        if (!parse_size(args->value[OPT_MAX_SIZE], "--max-size", &options.max_size))
            return EXIT_ERROR;
        if (options.max_size < size)
            return fail_msg("--max-size (%llu) is smaller than --size (%llu)",
                            (unsigned long long)options.max_size, (unsigned long long)size);
    }
    if (!parse_domain(args, &flags)) return EXIT_ERROR;

    nvh_pool *pool = nvh_pool_create_ex(args->path, args->value[OPT_LAYOUT], size, flags,
                                        &options);
    if (!pool) return fail_lib();
    nvh_pool_info info;
    nvh_pool_info_get(pool, &info);
    char size_buf[32], uuid_buf[37], domain_buf[32];
    printf("created %s: %s, layout \"%s\", domain %s, uuid %s\n", args->path,
           format_size(info.size, size_buf), info.layout,
           domain_label(info.created_domain, domain_buf), format_uuid(info.uuid, uuid_buf));
    if (nvh_pool_close(pool) != NVH_OK) return fail_lib();
    return EXIT_OK;
}

/* ==========================================================================
 * info: sections come from providers
 * ========================================================================== */
struct info_ctx {
    const char *path;
    nvh_pool *pool;
    nvh_pool_info info;
    bool read_write;
};

/* The pool: superblock facts plus how this open runs. closed-cleanly is the
 * state before this (read-only) open: "no" means the last writer crashed and
 * the next read-write open runs recovery. */
static void info_pool(const struct info_ctx *ctx, struct emitter *e)
{
    const nvh_pool_info *info = &ctx->info;
    char buf[40];
    emit_str(e, "path", ctx->path);
    emit_str(e, "layout", info->layout);
    emit_u64(e, "size", info->size);
    emit_u64(e, "max-size", info->max_size);
    emit_str(e, "uuid", format_uuid(info->uuid, buf));
    emit_u64(e, "epoch", info->epoch);
    emit_str(e, "closed-cleanly", info->clean_at_open ? "yes" : "no");
    emit_str(e, "domain", domain_label(info->created_domain, buf));
    emit_str(e, "detected-domain", domain_label(info->domain, buf));
    emit_str(e, "open-mode", ctx->read_write ? "read-write" : "read-only");
    emit_u64(e, "format-version", info->format_version);
    emit_u64(e, "root-offset", info->root_offset);
    emit_u64(e, "root-size", info->root_size);
    emit_u64(e, "heap-offset", info->heap_offset);
    emit_u64(e, "heap-size", info->heap_size);
    emit_str(e, "created", format_time_utc(info->create_time, buf));
    emit_str(e, "flush-instruction", info->flush_instruction ? info->flush_instruction : "none");
}

/* Persistence counters of this open: all zero for a read-only open (it
 * flushes nothing); with --rw they show what opening cost (the epoch bump). */
static void info_persistence_stats(const struct info_ctx *ctx, struct emitter *e)
{
    nvh_stats stats;
    nvh_stats_get(ctx->pool, &stats);
    emit_u64(e, "lines-flushed", stats.lines_flushed);
    emit_u64(e, "fences", stats.fences);
    emit_u64(e, "msyncs", stats.msyncs);
    emit_u64(e, "nt-bytes", stats.nt_bytes);
}

/* Allocator usage (a walk of every region header): per-class runs and
 * slots, large/huge objects, free space and fragmentation, quarantine and the
 * don't-allocate list. A pool whose heap was never used has only zeros. */
void emit_heap_stats(const nvh_heap_stats *stats, struct emitter *e)
{
    const nvh_heap_stats hs = *stats;
    emit_u64(e, "heap-chunk-size", hs.chunk_size);
    emit_u64(e, "heap-chunks", hs.chunks);
    emit_u64(e, "heap-bytes", hs.heap_bytes);
    emit_u64(e, "live-objects", hs.live_objects);
    emit_u64(e, "live-bytes", hs.live_bytes);
    emit_u64(e, "large-objects", hs.large_objects);
    emit_u64(e, "huge-objects", hs.huge_objects);
    emit_u64(e, "free-bytes", hs.free_bytes);
    emit_u64(e, "free-regions", hs.free_regions);
    emit_u64(e, "largest-free", hs.largest_free);
    emit_double(e, "fragmentation", hs.fragmentation, 4);
    emit_u64(e, "quarantined-bytes", hs.quarantined_bytes);
    emit_u64(e, "corrupt-regions", hs.corrupt_regions);
    emit_u64(e, "dont-allocate-entries", hs.fifo_entries);
    emit_u64(e, "dont-allocate-bytes", hs.fifo_bytes);
    emit_u64(e, "dont-allocate-delay-ns", hs.fifo_delay_ns);
    emit_u64(e, "records-replayed", hs.records_replayed);
    for (unsigned c = 1; c < sizeof hs.cls / sizeof hs.cls[0]; c++) {
        const nvh_heap_class_stats *k = &hs.cls[c];
        if (!k->runs) continue;
        char key[48], value[96];
        snprintf(key, sizeof key, "class-%u", 64 * c);
        snprintf(value, sizeof value, "runs %llu, slots %llu/%llu used",
                 (unsigned long long)k->runs, (unsigned long long)k->slots_used,
                 (unsigned long long)k->slots_total);
        emit_str(e, key, value);
    }
}

static void info_allocator_stats(const struct info_ctx *ctx, struct emitter *e)
{
    nvh_heap_stats hs;
    if (nvh_heap_stats_get(ctx->pool, &hs) == NVH_OK) emit_heap_stats(&hs, e);
}

static const struct info_provider {
    const char *name;
    bool stats;          /* shown only with --stats */
    void (*emit)(const struct info_ctx *ctx, struct emitter *e);
} info_providers[] = {
    {"pool", false, info_pool},
    {"persistence", true, info_persistence_stats},
    {"allocator", true, info_allocator_stats},
};

static int run_info(const struct args *args)
{
    unsigned flags = args->given[OPT_RW] ? 0 : NVH_OPEN_READONLY;
    if (!parse_domain(args, &flags)) return EXIT_ERROR;
    struct info_ctx ctx = {.path = args->path, .read_write = args->given[OPT_RW]};
    ctx.pool = nvh_pool_open(args->path, args->value[OPT_LAYOUT], flags);
    if (!ctx.pool) return fail_lib();
    nvh_pool_info_get(ctx.pool, &ctx.info);

    struct emitter e = {.out = stdout, .json = args->given[OPT_JSON]};
    emit_begin(&e);
    for (size_t i = 0; i < sizeof info_providers / sizeof info_providers[0]; i++)
        if (!info_providers[i].stats || args->given[OPT_STATS])
            info_providers[i].emit(&ctx, &e);
    emit_end(&e);
    if (nvh_pool_close(ctx.pool) != NVH_OK) return fail_lib();
    return fflush(stdout) == 0 ? EXIT_OK : fail_msg("cannot write the output: %s",
                                                    strerror(errno));
}

/* ==========================================================================
 * check: pread the superblock, then run the checkers in order
 * ========================================================================== */
enum severity { SEV_NOTE, SEV_WARNING, SEV_ERROR };

struct check_ctx {
    const char *path;
    const char *layout;        /* --layout, or NULL */
    int fd;
    uint64_t file_size;
    struct nvh_superblock sb;  /* as read from the file */
    int current;               /* current state slot, -1 if none is valid */
    nvh_pool *pool;            /* read-only open, for checkers of later layers */
    bool repair;               /* --repair: salvage what the check finds */
    bool no_backup;            /* --no-backup */
    bool repaired;             /* run_repair ran: errors/warnings are the re-check's */
    bool backup_failed;
    unsigned errors_before;    /* errors the first pass found (repaired runs) */
    unsigned errors, warnings;
    bool stop;                 /* a checker found the rest cannot run */
};

/* One finding per line: "<severity>: offset <byte offset>: <what>".
 * Errors make the pool inconsistent; warnings and notes do not. */
static void finding(struct check_ctx *c, enum severity sev, uint64_t offset, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void finding(struct check_ctx *c, enum severity sev, uint64_t offset, const char *fmt, ...)
{
    static const char *const names[] = {"note", "warning", "error"};
    va_list ap;
    va_start(ap, fmt);
    printf("%s: offset %llu: ", names[sev], (unsigned long long)offset);
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
    if (sev == SEV_ERROR) c->errors++;
    if (sev == SEV_WARNING) c->warnings++;
}

static bool all_zero(const void *p, size_t len, size_t *first_nonzero)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < len; i++)
        if (b[i]) {
            if (first_nonzero) *first_nonzero = i;
            return false;
        }
    return true;
}

static int read_full(int fd, void *buf, size_t len, off_t off)
{
    char *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len, off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        if (n == 0) break;   /* end of file: the caller sized len from fstat */
        p += n;
        len -= (size_t)n;
        off += n;
    }
    return 0;
}

#define HDR_OFF(field) ((uint64_t)offsetof(struct nvh_superblock_header, field))
#define SLOT_OFF(i) ((uint64_t)NVH_STATE_SLOT_OFFSET + (uint64_t)(i) * sizeof(struct nvh_superblock_state))
#define STATE_OFF(i, field) (SLOT_OFF(i) + offsetof(struct nvh_superblock_state, field))

/* ---- the file holds a whole superblock ------------------------------------ */
static void check_file(struct check_ctx *c)
{
    if (c->file_size < NVH_SUPERBLOCK_SIZE) {
        finding(c, SEV_ERROR, c->file_size, "file is truncated: %llu bytes, shorter than "
                "the %u-byte superblock", (unsigned long long)c->file_size, NVH_SUPERBLOCK_SIZE);
        c->stop = true;
    }
}

/* ---- superblock header: written once at create ---------------------------- */
static void check_area_table(struct check_ctx *c)
{
    const struct nvh_superblock_header *h = &c->sb.header;
    if (h->area_count > NVH_AREA_MAX) {
        finding(c, SEV_ERROR, HDR_OFF(area_count), "area table claims %u entries; it has room "
                "for %u", h->area_count, NVH_AREA_MAX);
        return;
    }
    bool root_seen = false, heap_seen = false;
    for (unsigned i = 0; i < NVH_AREA_MAX; i++) {
        const struct nvh_area *a = &h->areas[i];
        uint64_t off = HDR_OFF(areas) + (uint64_t)i * sizeof *a;
        if (i >= h->area_count) {
            if (!all_zero(a, sizeof *a, NULL))
                finding(c, SEV_WARNING, off, "unused area table entry %u is not zero", i);
            continue;
        }
        if (a->flags)
            finding(c, SEV_WARNING, off + offsetof(struct nvh_area, flags),
                    "area %u has reserved flags %#x set", i, a->flags);
        if (a->kind == NVH_AREA_ROOT) {
            if (root_seen) finding(c, SEV_ERROR, off, "area %u is a second root area", i);
            root_seen = true;
            if (a->offset != h->root_offset || a->size != h->root_size)
                finding(c, SEV_ERROR, off, "root area entry says %llu+%llu, the header says "
                        "%llu+%llu", (unsigned long long)a->offset, (unsigned long long)a->size,
                        (unsigned long long)h->root_offset, (unsigned long long)h->root_size);
        } else if (a->kind == NVH_AREA_HEAP) {
            if (heap_seen) finding(c, SEV_ERROR, off, "area %u is a second heap area", i);
            heap_seen = true;
            if (a->offset != h->heap_offset || a->size != 0)
                finding(c, SEV_ERROR, off, "heap area entry says %llu+%llu, the header says "
                        "the heap starts at %llu and runs to the end of the pool",
                        (unsigned long long)a->offset, (unsigned long long)a->size,
                        (unsigned long long)h->heap_offset);
        } else {
            finding(c, SEV_ERROR, off, "area %u has unknown kind %u", i, a->kind);
        }
    }
    if (!root_seen) finding(c, SEV_ERROR, HDR_OFF(areas), "area table has no root area");
    if (!heap_seen) finding(c, SEV_ERROR, HDR_OFF(areas), "area table has no heap area");
}

static void check_header(struct check_ctx *c)
{
    const struct nvh_superblock_header *h = &c->sb.header;
    size_t at;
    uint32_t sum = nvh_sb_header_checksum(h);
    if (h->checksum != sum)
        finding(c, SEV_ERROR, 0, "superblock header (bytes 0..%llu) fails its checksum: "
                "stored %08x at offset %llu, computed %08x; the pool cannot be opened",
                (unsigned long long)HDR_OFF(checksum) - 1, h->checksum,
                (unsigned long long)HDR_OFF(checksum), sum);
    if (h->format_version == 0)
        finding(c, SEV_ERROR, HDR_OFF(format_version), "format version is 0");
    if (h->header_size != sizeof *h)
        finding(c, SEV_ERROR, HDR_OFF(header_size), "header size is %u, expected %zu",
                h->header_size, sizeof *h);
    if (h->layout[NVH_LAYOUT_MAX] != '\0')
        finding(c, SEV_ERROR, HDR_OFF(layout), "layout name is not NUL-terminated");
    else {
        size_t len = strlen(h->layout);
        if (!all_zero(h->layout + len, sizeof h->layout - len, &at))
            finding(c, SEV_WARNING, HDR_OFF(layout) + len + at,
                    "layout name is not NUL-padded");
    }
    if (h->created_domain < NVH_DOMAIN_PMEM || h->created_domain > NVH_DOMAIN_SIM)
        finding(c, SEV_ERROR, HDR_OFF(created_domain), "created domain %u is not a domain",
                h->created_domain);
    if (h->feature_flags)
        finding(c, SEV_WARNING, HDR_OFF(feature_flags), "reserved feature flags %#x are set",
                h->feature_flags);
    if (h->root_offset != NVH_SUPERBLOCK_SIZE)
        finding(c, SEV_ERROR, HDR_OFF(root_offset), "root area starts at %llu, expected %u",
                (unsigned long long)h->root_offset, NVH_SUPERBLOCK_SIZE);
    if (h->root_size == 0 || h->root_size % NVH_PAGE || h->root_size > NVH_ROOT_MAX_SIZE)
        finding(c, SEV_ERROR, HDR_OFF(root_size), "root area size %llu is not a multiple of "
                "4 KiB between 4 KiB and 1 GiB", (unsigned long long)h->root_size);
    if (h->heap_offset != h->root_offset + h->root_size)
        finding(c, SEV_ERROR, HDR_OFF(heap_offset), "heap starts at %llu, not where the root "
                "area ends (%llu)", (unsigned long long)h->heap_offset,
                (unsigned long long)(h->root_offset + h->root_size));
    check_area_table(c);
    if (h->reserved0)
        finding(c, SEV_WARNING, HDR_OFF(reserved0), "reserved header field is %#x, not 0",
                h->reserved0);
    if (!all_zero(h->reserved1, sizeof h->reserved1, &at))
        finding(c, SEV_WARNING, HDR_OFF(reserved1) + at, "reserved header bytes are not zero");
    if (!all_zero(c->sb.reserved, sizeof c->sb.reserved, &at))
        finding(c, SEV_WARNING, offsetof(struct nvh_superblock, reserved) + at,
                "reserved superblock bytes are not zero");
}

/* ---- superblock state slots: the mutable facts ---------------------------- */
enum slot_status { SLOT_VALID, SLOT_UNUSED, SLOT_BAD };

/* Valid exactly when the library would accept the slot (pool.c). */
static enum slot_status classify_slot(const struct check_ctx *c, unsigned i, char *why,
                                      size_t why_len)
{
    const struct nvh_superblock_state *s = &c->sb.state[i];
    uint32_t sum = nvh_sb_state_checksum(s);
    uint32_t uuid_crc = nvh_sb_uuid_crc(&c->sb.header);
    if (all_zero(s, sizeof *s, NULL)) {
        snprintf(why, why_len, "never written");
        return SLOT_UNUSED;
    }
    if (s->checksum != sum) {
        snprintf(why, why_len, "checksum mismatch (stored %08x at offset %llu, computed %08x)",
                 s->checksum, (unsigned long long)STATE_OFF(i, checksum), sum);
        return SLOT_BAD;
    }
    if (s->sequence == 0) {
        snprintf(why, why_len, "sequence number is 0");
        return SLOT_BAD;
    }
    if (s->uuid_crc != uuid_crc) {
        snprintf(why, why_len, "uuid crc %08x does not match the header's uuid (%08x): "
                 "the slot is another pool's, or the header is damaged", s->uuid_crc, uuid_crc);
        return SLOT_BAD;
    }
    return SLOT_VALID;
}

static void check_current_state(struct check_ctx *c, unsigned i)
{
    const struct nvh_superblock_header *h = &c->sb.header;
    const struct nvh_superblock_state *s = &c->sb.state[i];
    size_t at;
    if (s->sequence % 2 != i)
        finding(c, SEV_ERROR, STATE_OFF(i, sequence), "current state slot %u holds sequence "
                "%llu, which belongs in slot %llu (the next update would overwrite the "
                "current state)", i, (unsigned long long)s->sequence,
                (unsigned long long)(s->sequence % 2));
    if (s->pool_size < NVH_POOL_MIN_SIZE || s->pool_size > NVH_POOL_MAX_SIZE ||
        s->pool_size % NVH_PAGE)
        finding(c, SEV_ERROR, STATE_OFF(i, pool_size), "pool size %llu is not a multiple of "
                "4 KiB between 1 MiB and 16 TiB", (unsigned long long)s->pool_size);
    if (h->heap_offset > s->pool_size)
        finding(c, SEV_ERROR, STATE_OFF(i, pool_size), "pool size %llu ends before the heap "
                "starts (%llu)", (unsigned long long)s->pool_size,
                (unsigned long long)h->heap_offset);
    if (c->file_size < s->pool_size)
        finding(c, SEV_ERROR, c->file_size, "file is truncated: %llu bytes, the pool is %llu",
                (unsigned long long)c->file_size, (unsigned long long)s->pool_size);
    else if (c->file_size > s->pool_size)
        finding(c, SEV_NOTE, s->pool_size, "file is %llu bytes longer than the pool (an "
                "interrupted grow leaves this; harmless)",
                (unsigned long long)(c->file_size - s->pool_size));
    if (s->clean > 1)
        finding(c, SEV_WARNING, STATE_OFF(i, clean), "clean flag is %u, not 0 or 1", s->clean);
    else if (s->clean == 0)
        finding(c, SEV_NOTE, STATE_OFF(i, clean), "pool was not closed cleanly (the last "
                "read-write open crashed or never closed it)");
    if ((s->flags & ~NVH_STATE_HEAP) || !all_zero(s->reserved1, sizeof s->reserved1, &at))
        finding(c, SEV_WARNING, (s->flags & ~NVH_STATE_HEAP) ? STATE_OFF(i, flags)
                                                             : STATE_OFF(i, reserved1) + at,
                "reserved bytes of state slot %u are not zero", i);
}

/* A bad slot is an error only when neither slot is valid (the pool cannot be
 * opened). The non-current slot is where the next update goes: a crash in
 * the middle of an update leaves it torn, by design, and the pool runs on
 * the other slot — so damage there is a warning, not an inconsistency. */
static void check_state(struct check_ctx *c)
{
    enum slot_status status[2];
    char why[2][160];
    for (unsigned i = 0; i < 2; i++) status[i] = classify_slot(c, i, why[i], sizeof why[i]);
    const struct nvh_superblock_state *st = c->sb.state;
    if (status[0] == SLOT_VALID && status[1] == SLOT_VALID)
        c->current = st[1].sequence > st[0].sequence ? 1 : 0;
    else
        c->current = status[0] == SLOT_VALID ? 0 : status[1] == SLOT_VALID ? 1 : -1;

    if (c->current < 0) {
        for (unsigned i = 0; i < 2; i++)
            finding(c, SEV_ERROR, SLOT_OFF(i), "state slot %u: %s", i, why[i]);
        finding(c, SEV_ERROR, SLOT_OFF(0), "no valid state slot: the pool cannot be opened");
        c->stop = true;
        return;
    }
    unsigned cur = (unsigned)c->current, other = 1 - cur;
    check_current_state(c, cur);
    if (status[other] == SLOT_BAD) {
        char newer[256] = "";
        if (st[other].sequence > st[cur].sequence)
            snprintf(newer, sizeof newer, "; its sequence field (%llu) is newer than the "
                     "current slot's (%llu): the latest state update was torn or lost and "
                     "the pool falls back to the previous state",
                     (unsigned long long)st[other].sequence, (unsigned long long)st[cur].sequence);
        finding(c, SEV_WARNING, SLOT_OFF(other), "state slot %u (not current): %s%s; the "
                "pool is usable, the next state update overwrites this slot", other,
                why[other], newer);
    } else if (status[other] == SLOT_VALID && st[other].sequence % 2 != other) {
        finding(c, SEV_WARNING, STATE_OFF(other, sequence), "state slot %u (not current) "
                "holds sequence %llu, which belongs in slot %llu", other,
                (unsigned long long)st[other].sequence,
                (unsigned long long)(st[other].sequence % 2));
    }
}

/* ---- the library agrees: a read-only open succeeds and sees the same ------ */
static void check_library_open(struct check_ctx *c)
{
    if (c->errors) return;   /* it would refuse for the reasons already printed */
    /* Reading only, so the domain does not matter; naming one keeps an
     * NVHEAP_DOMAIN=sim environment (read-write only) from refusing. */
    c->pool = nvh_pool_open(c->path, c->layout, NVH_OPEN_READONLY | NVH_DOMAIN_PROCESS);
    if (!c->pool) {
        finding(c, SEV_ERROR, 0, "the library refuses to open the pool: %s", nvh_errormsg());
        c->stop = true;
        return;
    }
    nvh_pool_info info;
    nvh_pool_info_get(c->pool, &info);
    const struct nvh_superblock_state *s = &c->sb.state[c->current];
    if (info.size != s->pool_size || info.epoch != s->epoch)
        finding(c, SEV_ERROR, SLOT_OFF(c->current), "the library opens the pool with size "
                "%llu and epoch %llu, this check read size %llu and epoch %llu",
                (unsigned long long)info.size, (unsigned long long)info.epoch,
                (unsigned long long)s->pool_size, (unsigned long long)s->epoch);
}

/* ---- the heap: every region header's checksum (size, state, position) ---- */
static void heap_finding(uint64_t offset, uint64_t length, const char *what, void *arg)
{
    struct check_ctx *c = arg;
    finding(c, SEV_ERROR, offset, "heap region of %llu bytes: %s", (unsigned long long)length,
            what);
}

static void check_heap(struct check_ctx *c)
{
    if (!c->pool) return;
    uint64_t corrupt = 0;
    int rc = nvh_heap_check(c->pool, heap_finding, c, 0, &corrupt);
    if (rc != NVH_OK && rc != NVH_E_CORRUPT)
        finding(c, SEV_ERROR, 0, "heap check failed: %s", nvh_errormsg());
}

/* ---- the containers: every B+ tree and hash map in the pool --------------
 * B+ trees are the named objects "nvh.btree.NAME"; hash maps are found as
 * the heap objects that start with a hash-map root (magic, version). Each is
 * opened through the library (which validates its header) and checked by
 * its own checker (nvh_btree_check, nvh_hmap_check). */
#define MAX_CONTAINERS 4096

static int collect_tree(const char *name, void *ptr, size_t size, void *arg)
{
    (void)ptr; (void)size;
    struct containers *k = arg;
    if (strncmp(name, TREE_PREFIX, strlen(TREE_PREFIX)) == 0 && k->ntrees < MAX_CONTAINERS)
        snprintf(k->trees[k->ntrees++], NVH_NAME_MAX + 1, "%s", name + strlen(TREE_PREFIX));
    return 0;
}

static int collect_map(void *ptr, size_t usable, void *arg)
{
    struct containers *k = arg;
    const struct nvh_hm_root *r = ptr;
    if (usable >= sizeof *r && r->magic == NVH_HM_MAGIC && r->version == NVH_HM_VERSION &&
        k->nmaps < MAX_CONTAINERS)
        k->maps[k->nmaps++] = nvh_off(k->pool, ptr);
    return 0;
}

bool find_containers(nvh_pool *pool, struct containers *k)
{
    memset(k, 0, sizeof *k);
    k->pool = pool;
    k->trees = calloc(MAX_CONTAINERS, sizeof *k->trees);
    k->maps = calloc(MAX_CONTAINERS, sizeof *k->maps);
    if (!k->trees || !k->maps) return false;
    nvh_named_foreach(pool, collect_tree, k);
    nvh_heap_foreach(pool, collect_map, k);
    /* Maps are usually linked from the root area: look there too, so that a
     * map is checked even when damaged allocator metadata hides its object
     * from nvh_heap_foreach. */
    uint64_t root_size = 0;
    const nvh_off_t *root = nvh_root(pool, &root_size);
    for (uint64_t i = 0; root && i < root_size / sizeof *root; i++) {
        const struct nvh_hm_root *r = nvh_ptr(pool, root[i]);
        if (!r || root[i] % NVH_ALLOC_ALIGN || !nvh_contains(pool, r, sizeof *r) ||
            r->magic != NVH_HM_MAGIC || r->version != NVH_HM_VERSION)
            continue;
        bool known = false;
        for (unsigned j = 0; j < k->nmaps && !known; j++) known = k->maps[j] == root[i];
        if (!known && k->nmaps < MAX_CONTAINERS) k->maps[k->nmaps++] = root[i];
    }
    return true;
}

void free_containers(struct containers *k)
{
    free(k->trees);
    free(k->maps);
}

/* Offset of the tree's header object (0 if it cannot be found). */
static uint64_t tree_header_offset(nvh_pool *pool, const char *name)
{
    char full[NVH_NAME_MAX + 1];
    snprintf(full, sizeof full, TREE_PREFIX "%s", name);
    void *h = nvh_get_named(pool, full, NULL);
    return h ? nvh_off(pool, h) : 0;
}

static int count_key(uint64_t key, const void *value, size_t len, void *arg)
{
    (void)key; (void)value; (void)len;
    ++*(uint64_t *)arg;
    return 0;
}

/* Check one tree: NVH_OK, or the error (already reported). */
static int check_tree(struct check_ctx *c, nvh_pool *pool, const char *name)
{
    uint64_t at = tree_header_offset(pool, name);
    /* FLUSH: the default mode's persist-group context needs a writable pool */
    nvh_btree_options ro = {.mode = NVH_BTREE_FLUSH};
    nvh_btree *t = nvh_btree_open(pool, name, 0, &ro);
    if (!t) {
        int rc = nvh_errcode();
        finding(c, SEV_ERROR, at, "B+ tree '%s' does not open: %s", name, nvh_errormsg());
        return rc;
    }
    int rc = nvh_btree_check(t);
    if (rc != NVH_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", nvh_errormsg());
        uint64_t keys = 0;
        nvh_btree_scan(t, 0, UINT64_MAX, count_key, &keys);
        finding(c, SEV_ERROR, at, "B+ tree '%s': %s (%llu keys readable)", name, msg,
                (unsigned long long)keys);
    } else {
        finding(c, SEV_NOTE, at, "B+ tree '%s': %llu keys, consistent", name,
                (unsigned long long)nvh_btree_count(t));
    }
    nvh_btree_close(t);
    return rc;
}

static int check_map(struct check_ctx *c, nvh_pool *pool, nvh_off_t off)
{
    nvh_hmap *m = nvh_hmap_open(pool, off);
    if (!m) {
        int rc = nvh_errcode();
        finding(c, SEV_ERROR, off, "hash map does not open: %s", nvh_errormsg());
        return rc;
    }
    nvh_hmap_stats st;
    int rc = nvh_hmap_check(m, &st);
    if (rc != NVH_OK)
        finding(c, SEV_ERROR, off, "hash map: %s", nvh_errormsg());
    else
        finding(c, SEV_NOTE, off, "hash map: %llu entries, consistent",
                (unsigned long long)st.count);
    nvh_hmap_close(m);
    return rc;
}

static void check_containers_of(struct check_ctx *c, nvh_pool *pool)
{
    struct containers k;
    if (!find_containers(pool, &k)) {
        finding(c, SEV_ERROR, 0, "out of memory listing the containers");
        free_containers(&k);
        return;
    }
    for (unsigned i = 0; i < k.ntrees; i++) check_tree(c, pool, k.trees[i]);
    for (unsigned i = 0; i < k.nmaps; i++) check_map(c, pool, k.maps[i]);
    free_containers(&k);
}

static int copy_file(int in, uint64_t size, int out);

/* A pool that was not closed cleanly is checked as the next open will see
 * it: its allocator log holds effects (new tree nodes, map entries) that
 * only recovery applies, and a read-only open does not recover, so the
 * containers would read as pointing at unallocated memory. The containers
 * are therefore checked on a recovered private copy ($TMPDIR, removed
 * after); the pool itself is not touched. */
static void check_containers(struct check_ctx *c)
{
    if (!c->pool) return;
    bool clean = c->current >= 0 && c->sb.state[c->current].clean == 1;
    if (clean) {
        check_containers_of(c, c->pool);
        return;
    }
    const char *tmp = getenv("TMPDIR");
    char copy[4200];
    snprintf(copy, sizeof copy, "%s/nvheap-check-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(copy);
    int err = fd < 0 ? errno : copy_file(c->fd, c->file_size, fd);
    if (fd >= 0) close(fd);
    nvh_pool *pool = err ? NULL : nvh_pool_open(copy, NULL, NVH_DOMAIN_PROCESS);
    if (!pool) {
        finding(c, SEV_WARNING, 0, "the pool was not closed cleanly and no recovered copy "
                "could be made (%s): the containers are checked without recovery",
                err ? strerror(err) : nvh_errormsg());
        check_containers_of(c, c->pool);
    } else {
        finding(c, SEV_NOTE, 0, "the pool was not closed cleanly: its containers are checked "
                "as recovery leaves them (on a private copy)");
        check_containers_of(c, pool);
        nvh_pool_close(pool);
    }
    if (fd >= 0) unlink(copy);
}

static const struct checker {
    const char *name;
    void (*run)(struct check_ctx *c);
} checkers[] = {
    {"file", check_file},
    {"superblock header", check_header},
    {"superblock state", check_state},
    {"library open", check_library_open},
    {"heap", check_heap},
    {"containers", check_containers},
};

/* ==========================================================================
 * check --repair: back up, quarantine, salvage, check again
 * ========================================================================== */
/* Copy size bytes of in to out (both at offset 0). 0 or an errno. */
static int copy_file(int in, uint64_t size, int out)
{
    static char buf[1 << 16];
    uint64_t done = 0;
    while (done < size) {
        size_t want = size - done < sizeof buf ? (size_t)(size - done) : sizeof buf;
        ssize_t n = pread(in, buf, want, (off_t)done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return n < 0 ? errno : EIO;
        for (ssize_t w = 0; w < n;) {
            ssize_t k = pwrite(out, buf + w, (size_t)(n - w), (off_t)(done + (uint64_t)w));
            if (k < 0 && errno == EINTR) continue;
            if (k < 0) return errno;
            w += k;
        }
        done += (uint64_t)n;
    }
    return 0;
}

/* Copy the pool to PATH.bak (PATH.bak.N if that exists), never overwriting.
 * Returns false (reported) if no backup could be written. */
static bool write_backup(struct check_ctx *c)
{
    char bak[4200];
    int out = -1;
    for (unsigned n = 0; n < 100 && out < 0; n++) {
        if (n == 0) snprintf(bak, sizeof bak, "%s.bak", c->path);
        else snprintf(bak, sizeof bak, "%s.bak.%u", c->path, n);
        out = open(bak, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (out < 0 && errno != EEXIST) break;
    }
    if (out < 0) {
        fail_msg("cannot write a backup of %s (%s): %s; nothing was repaired (--no-backup "
                 "repairs without one)", c->path, bak, strerror(errno));
        return false;
    }
    int err = copy_file(c->fd, c->file_size, out);
    if (!err && fsync(out) != 0) err = errno;
    close(out);
    if (err) {
        unlink(bak);
        fail_msg("cannot write the backup %s: %s; nothing was repaired", bak, strerror(err));
        return false;
    }
    printf("repair: backup of the pool written to %s\n", bak);
    return true;
}

static void repair_heap_fn(uint64_t offset, uint64_t length, const char *what, void *arg)
{
    (void)arg;
    printf("repair: offset %llu: heap region of %llu bytes: %s (quarantined: the objects in "
           "it are removed)\n", (unsigned long long)offset, (unsigned long long)length, what);
}

struct kv { uint64_t key; size_t len; unsigned char *value; };
struct kv_list { struct kv *v; size_t n, cap; bool oom; };

static int collect_kv(uint64_t key, const void *value, size_t len, void *arg)
{
    struct kv_list *l = arg;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        struct kv *v = realloc(l->v, cap * sizeof *v);
        if (!v) { l->oom = true; return 1; }
        l->v = v;
        l->cap = cap;
    }
    unsigned char *copy = malloc(len ? len : 1);
    if (!copy) { l->oom = true; return 1; }
    memcpy(copy, value, len);
    l->v[l->n++] = (struct kv){key, len, copy};
    return 0;
}

/* Rebuild a damaged tree from the keys that can still be read: copy them
 * out, empty the tree's header in place (root and slab list 0: the old
 * nodes and slabs stay allocated but unreachable, since freeing them would
 * trust the damaged structure; the header is kept even in a quarantined
 * region, so the tree keeps its name), then put the keys back. A crash in
 * between leaves a smaller tree; the backup has the original. */
static void salvage_tree(nvh_pool *pool, const char *name)
{
    struct kv_list l = {0};
    nvh_btree *t = nvh_btree_open(pool, name, 0, NULL);
    char damage[512];
    if (t) {
        int rc = nvh_btree_check(t);
        snprintf(damage, sizeof damage, "%s", rc == NVH_OK ? "nothing" : nvh_errormsg());
        nvh_btree_scan(t, 0, UINT64_MAX, collect_kv, &l);
        nvh_btree_close(t);
    } else {
        snprintf(damage, sizeof damage, "%s", nvh_errormsg());
    }
    if (l.oom) {
        printf("repair: B+ tree '%s': out of memory copying its keys; left as it is\n", name);
        goto out;
    }
    char full[NVH_NAME_MAX + 1];
    snprintf(full, sizeof full, TREE_PREFIX "%s", name);
    bt_header *h = nvh_get_named(pool, full, NULL);
    if (!h || !nvh_contains(pool, h, sizeof *h)) {
        printf("repair: B+ tree '%s': its header cannot be found (%s); left as it is\n", name,
               nvh_errormsg());
        goto out;
    }
    if (h->magic != BT_MAGIC_TREE || h->version != BT_VERSION || h->node_size != BT_NODE_SIZE) {
        /* the header line itself is damaged: make it a valid empty header */
        memset(h, 0, sizeof *h);
        h->magic = BT_MAGIC_TREE;
        h->version = BT_VERSION;
        h->node_size = BT_NODE_SIZE;
    }
    nvh_unprotect(pool, h, sizeof *h);
    h->root = 0;
    h->slabs = 0;
    nvh_persist(pool, h, sizeof *h);
    nvh_protect(pool, h, sizeof *h);
    t = nvh_btree_open(pool, name, 0, NULL);
    size_t put = 0;
    for (size_t i = 0; t && i < l.n; i++)
        if (nvh_btree_put(t, l.v[i].key, l.v[i].value, l.v[i].len) == NVH_OK) put++;
    if (!t || nvh_btree_close(t) != NVH_OK) {
        printf("repair: B+ tree '%s': rebuilding failed: %s\n", name, nvh_errormsg());
        goto out;
    }
    printf("repair: B+ tree '%s' rebuilt with its %zu readable keys; removed: the part "
           "beyond the damage (%s); the old nodes stay allocated, unreachable\n", name, put,
           damage);
out:
    for (size_t i = 0; i < l.n; i++) free(l.v[i].value);
    free(l.v);
}

static void salvage_map_fn(uint64_t link_off, uint64_t old_value, uint64_t new_value,
                           const char *why, void *arg)
{
    printf("repair: offset %llu: hash map at %llu: link to %llu was %s; now %s%llu (the "
           "entries in between are removed)\n", (unsigned long long)link_off,
           (unsigned long long)*(nvh_off_t *)arg, (unsigned long long)old_value, why,
           new_value ? "points at the next intact bucket, " : "ends the list, ",
           (unsigned long long)new_value);
}

static void salvage_map(nvh_pool *pool, nvh_off_t off)
{
    nvh_hmap *m = nvh_hmap_open(pool, off);
    if (!m) {
        printf("repair: offset %llu: hash map does not open (%s); left as it is\n",
               (unsigned long long)off, nvh_errormsg());
        return;
    }
    int n = nvh_hm_salvage_(m, salvage_map_fn, &off);
    if (n < 0)
        printf("repair: offset %llu: hash map: %s\n", (unsigned long long)off, nvh_errormsg());
    nvh_hmap_stats st;
    if (nvh_hmap_check(m, &st) == NVH_OK && st.count_repaired)
        printf("repair: offset %llu: hash map: count set to %llu entries\n",
               (unsigned long long)off, (unsigned long long)st.count);
    nvh_hmap_close(m);
}

/* The check found errors and the library opens the pool: repair what can
 * be repaired, then check everything again. */
static void run_repair(struct check_ctx *c)
{
    if (!c->no_backup && !write_backup(c)) {
        c->backup_failed = true;
        return;
    }
    /* Repairs need read-write opens: give up the read-only one and the
     * shared lock first, or the library would find the pool busy. */
    nvh_pool_close(c->pool);
    c->pool = NULL;
    flock(c->fd, LOCK_UN);
    uint64_t corrupt = 0;
    int rc = nvh_heap_check_path(c->path, repair_heap_fn, NULL, 1, &corrupt);
    if (rc != NVH_OK && rc != NVH_E_CORRUPT) printf("repair: heap: %s\n", nvh_errormsg());
    nvh_pool *pool = nvh_pool_open(c->path, c->layout, 0);
    if (!pool) {
        printf("repair: the pool does not open read-write: %s\n", nvh_errormsg());
    } else {
        struct containers k;
        if (find_containers(pool, &k)) {
            for (unsigned i = 0; i < k.ntrees; i++) {
                nvh_btree *t = nvh_btree_open(pool, k.trees[i], 0, NULL);
                bool bad = !t || nvh_btree_check(t) != NVH_OK;
                if (t) nvh_btree_close(t);
                if (bad) salvage_tree(pool, k.trees[i]);
            }
            for (unsigned i = 0; i < k.nmaps; i++) salvage_map(pool, k.maps[i]);
        }
        free_containers(&k);
        if (nvh_pool_close(pool) != NVH_OK) printf("repair: close: %s\n", nvh_errormsg());
    }
    /* check again, read-only, under the shared lock again */
    printf("after repair:\n");
    c->errors_before = c->errors;
    c->errors = c->warnings = 0;
    c->repaired = true;
    while (flock(c->fd, LOCK_SH | LOCK_NB) != 0 && errno == EINTR) {}
    /* the repair's opens moved the epoch on: read the superblock again */
    struct stat st;
    if (fstat(c->fd, &st) == 0) c->file_size = (uint64_t)st.st_size;
    if (read_full(c->fd, &c->sb, sizeof c->sb, 0) != 0) {
        finding(c, SEV_ERROR, 0, "cannot read the superblock again: %s", strerror(errno));
        return;
    }
    check_state(c);
    for (size_t i = 3; i < sizeof checkers / sizeof checkers[0] && !c->stop; i++)
        checkers[i].run(c);    /* library open, heap, containers */
}

/* Open, lock (shared: a read-write open elsewhere makes it busy), read the
 * superblock. Returns EXIT_OK, or EXIT_ERROR (printed) when the file cannot
 * be checked at all: missing, unreadable, not a pool, newer format, wrong
 * layout, in use. */
static int check_prepare(struct check_ctx *c)
{
    /* O_NONBLOCK: a FIFO would block the open until a writer came */
    c->fd = open(c->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (c->fd < 0) return fail_msg("cannot open %s: %s", c->path, strerror(errno));
    struct stat st;
    if (fstat(c->fd, &st) != 0) return fail_msg("cannot stat %s: %s", c->path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return fail_msg("%s is not a regular file", c->path);
    while (flock(c->fd, LOCK_SH | LOCK_NB) != 0) {
        if (errno == EINTR) continue;
        if (errno == EWOULDBLOCK)
            return fail_msg("pool %s is in use (open read-write in this or another process)",
                            c->path);
        return fail_msg("cannot lock %s: %s", c->path, strerror(errno));
    }
    c->file_size = (uint64_t)st.st_size;
    size_t have = c->file_size < sizeof c->sb ? (size_t)c->file_size : sizeof c->sb;
    memset(&c->sb, 0, sizeof c->sb);
    if (read_full(c->fd, &c->sb, have, 0) != 0)
        return fail_msg("cannot read %s: %s", c->path, strerror(errno));
    const struct nvh_superblock_header *h = &c->sb.header;
    if (have < sizeof h->magic || memcmp(h->magic, NVH_MAGIC, sizeof h->magic) != 0)
        return fail_msg("%s is not an nvheap pool (bad magic)", c->path);
    if (h->format_version > NVH_FORMAT_VERSION)
        return fail_msg("%s has format version %u; this nvheap reads up to %u", c->path,
                        h->format_version, NVH_FORMAT_VERSION);
    /* Compare the layout only if the header can be trusted; a corrupt header
     * is reported as a finding instead. */
    if (c->layout && h->checksum == nvh_sb_header_checksum(h) &&
        h->layout[NVH_LAYOUT_MAX] == '\0' && strcmp(h->layout, c->layout) != 0)
        return fail_msg("%s has layout '%s', expected '%s'", c->path, h->layout, c->layout);
    return EXIT_OK;
}

static int run_check(const struct args *args)
{
    if (args->given[OPT_NO_BACKUP] && !args->given[OPT_REPAIR])
        return usage_error(args->command, "--no-backup needs --repair");
    struct check_ctx c = {.path = args->path, .layout = args->value[OPT_LAYOUT], .fd = -1,
                          .current = -1, .repair = args->given[OPT_REPAIR],
                          .no_backup = args->given[OPT_NO_BACKUP]};
    int rc = check_prepare(&c);
    if (rc == EXIT_OK) {
        for (size_t i = 0; i < sizeof checkers / sizeof checkers[0] && !c.stop; i++)
            checkers[i].run(&c);
        /* Repair only what the library opens (a superblock it refuses is
         * beyond repair here), and only if something is wrong: a
         * consistent pool is never written. */
        if (c.repair && c.errors && c.pool) run_repair(&c);
        if (c.backup_failed) {
            rc = EXIT_ERROR;
        } else {
            printf("%s: %s%s (%u error%s, %u warning%s", c.path,
                   c.errors ? "INCONSISTENT" : "consistent", c.repaired ? " after repair" : "",
                   c.errors, c.errors == 1 ? "" : "s", c.warnings, c.warnings == 1 ? "" : "s");
            if (c.repaired)
                printf("; %u error%s found before the repair", c.errors_before,
                       c.errors_before == 1 ? "" : "s");
            printf(")\n");
            rc = c.errors ? EXIT_INCONSISTENT : EXIT_OK;
        }
    }
    if (c.pool) nvh_pool_close(c.pool);
    if (c.fd >= 0) close(c.fd);
    if (fflush(stdout) != 0) return fail_msg("cannot write the output: %s", strerror(errno));
    return rc;
}

/* ==========================================================================
 * main
 * ========================================================================== */
int main(int argc, char **argv)
{
    if (argc < 2) return usage_error(NULL, "missing command");
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        print_usage(stdout);
        return EXIT_OK;
    }
    if (strcmp(name, "--version") == 0) {
        printf("nvheap %d.%d.%d (pool format %u)\n", NVH_VERSION_MAJOR, NVH_VERSION_MINOR,
               NVH_VERSION_PATCH, NVH_FORMAT_VERSION);
        return EXIT_OK;
    }
    if (strcmp(name, "help") == 0) {
        if (argc == 2) {
            print_usage(stdout);
            return EXIT_OK;
        }
        const struct command *cmd = find_command(argv[2]);
        if (!cmd) return usage_error(NULL, "help: unknown command '%s'", argv[2]);
        if (argc > 3) return usage_error(NULL, "help: unexpected argument '%s'", argv[3]);
        print_command_help(cmd, stdout);
        return EXIT_OK;
    }
    const struct command *cmd = find_command(name);
    if (!cmd) return usage_error(NULL, "unknown command '%s'", name);
    struct args args;
    int rc = parse_args(cmd, argc - 2, argv + 2, &args);
    if (rc != EXIT_OK) return rc;
    if (args.given[OPT_HELP]) {
        print_command_help(cmd, stdout);
        return EXIT_OK;
    }
    return cmd->run(&args);
}
