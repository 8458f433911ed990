/* cli.h — what the files of the `nvheap` tool share: exit codes, messages,
 * sizes, the parsed command line, the key/value output emitter, and the
 * entry point of every command (one file per command group:
 * nvheap.c create/info/check and main, cmd_stat.c ls/stat, cmd_kv.c
 * dump/load/get/put/rm, kv_text.c the dump format). docs/CLI.md documents
 * every command, option, output key and exit code. */
#ifndef NVH_TOOLS_CLI_H
#define NVH_TOOLS_CLI_H

#include "nvheap.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Exit status: 0 success; 1 `check` found the pool inconsistent, or get/rm
 * found no such key; 2 any error. */
enum { EXIT_OK = 0, EXIT_INCONSISTENT = 1, EXIT_NOTFOUND = 1, EXIT_ERROR = 2 };

/* ---- messages: "nvheap: <message>" on stderr -------------------------------- */
void cli_vmessage(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));
int fail_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));   /* EXIT_ERROR */
int fail_lib(void);      /* nvh_errormsg() of the last failure; EXIT_ERROR */

/* ---- sizes and labels ------------------------------------------------------ */
bool parse_size(const char *text, const char *option, uint64_t *out);   /* reports */
const char *format_size(uint64_t size, char buf[32]);
const char *format_uuid(const uint8_t uuid[16], char buf[37]);
const char *format_time_utc(uint64_t seconds, char buf[32]);
const char *domain_label(nvh_domain domain, char buf[32]);

/* ---- the command line ------------------------------------------------------ */
enum opt_id {
    OPT_HELP, OPT_SIZE, OPT_LAYOUT, OPT_DOMAIN, OPT_ROOT_SIZE, OPT_MAX_SIZE,
    OPT_SPARSE, OPT_STATS, OPT_JSON, OPT_RW, OPT_REPAIR, OPT_NO_BACKUP,
    OPT_HEX, OPT_ENGINE, OPT_CREATE, OPT_PROGRESS, OPT_NO_PROGRESS, OPT_COUNT_
};
#define OPT_BIT(id) (1u << (id))
#define CLI_MAX_ARGS 4

struct command;

struct args {
    const struct command *command;
    const char *path;                 /* arg[0]: the pool */
    const char *arg[CLI_MAX_ARGS];    /* positional arguments, in order */
    unsigned nargs;
    bool given[OPT_COUNT_];
    const char *value[OPT_COUNT_];
};

struct command {
    const char *name;
    const char *synopsis;   /* after "nvheap " */
    const char *summary;    /* one line for the global help */
    const char *details;    /* options for `nvheap help CMD` */
    const char *notes;      /* paragraph after the options, or NULL */
    unsigned options;       /* OPT_BIT()s this command accepts */
    int (*run)(const struct args *args);
    /* positional arguments: names ("PATH STORE KEY VALUE"), how many are
     * required and allowed; 0/0 = just PATH */
    const char *arg_names;
    unsigned min_args, max_args;
};

/* A usage error: message, the command's synopsis, EXIT_ERROR. */
int usage_error(const struct command *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
bool parse_domain(const struct args *args, unsigned *flags);   /* --domain; reports */

/* ---- output: "key: value" lines, or one JSON object with the same keys ------ */
struct emitter {
    FILE *out;
    bool json;
    unsigned fields;      /* emitted at this depth so far */
    unsigned depth;       /* nesting of emit_open */
    unsigned saved[8];    /* fields of the enclosing objects */
};
void emit_begin(struct emitter *e);
void emit_key(struct emitter *e, const char *key);
void emit_str(struct emitter *e, const char *key, const char *value);
void emit_u64(struct emitter *e, const char *key, uint64_t value);
void emit_double(struct emitter *e, const char *key, double value, int decimals);
/* A nested object: JSON "key": {...}; text: "key:" then its keys indented. */
void emit_open(struct emitter *e, const char *key);
void emit_close(struct emitter *e);
void emit_end(struct emitter *e);
void emit_json_string(FILE *out, const char *s);

/* The allocator section of `info --stats` and `stat` (nvh_heap_stats_get). */
void emit_heap_stats(const nvh_heap_stats *stats, struct emitter *e);

/* ---- containers: B+ trees (by name) and hash maps (by offset) in a pool ------ */
struct containers {
    char (*trees)[NVH_NAME_MAX + 1];
    unsigned ntrees;
    nvh_off_t *maps;
    unsigned nmaps;
    nvh_pool *pool;
};
bool find_containers(nvh_pool *pool, struct containers *k);
void free_containers(struct containers *k);
#define TREE_PREFIX "nvh.btree."

/* ---- progress bar on stderr (only when stderr is a terminal) ---------------- */
struct progress {
    const char *what;      /* "dump", "load" */
    uint64_t total;        /* 0 = unknown */
    uint64_t done;
    bool on, forced, drawn;
    uint64_t last_ns;     /* last draw (or when the first may happen) */
};
void progress_start(struct progress *p, const char *what, uint64_t total, const struct args *a);
void progress_step(struct progress *p, uint64_t done);
void progress_end(struct progress *p);

/* ---- the dump format (kv_text.c; docs/CLI.md "Dump format") ------------------
 *   NVHEAP-DUMP=1            first line
 *   format=print|bytevalue   print: bytes 0x20..0x7e as they are, except the
 *                            backslash, written twice; every other byte as a
 *                            backslash and two hex digits; bytevalue: every
 *                            byte as two hex digits
 *   engine=sorted|hash       engine of the dumped store
 *   store=NAME               its name (encoded as the format says)
 *   entries=N                how many entries follow
 *   HEADER=END
 *    KEY                     one line per key, one per value, each after
 *    VALUE                   one space
 *   DATA=END                 last line
 * Unknown header keys are ignored; anything else out of place is an error
 * naming its line. */
#define KVT_MAGIC_LINE "NVHEAP-DUMP=1"

struct kvt_buf {
    unsigned char *p;
    size_t len, cap;
};
void kvt_buf_free(struct kvt_buf *b);

struct kvt_header {
    bool hex;                         /* format=bytevalue */
    char engine[16];
    char store[NVH_KV_NAME_MAX + 1];
    uint64_t entries;
};

/* Writing: 0, or -1 with errno set (a write error). */
int kvt_write_header(FILE *out, const struct kvt_header *h);
int kvt_write_data(FILE *out, bool hex, const void *data, size_t len);
int kvt_write_end(FILE *out);

/* Reading from a whole input in memory. */
struct kvt_reader {
    const char *p, *end;
    uint64_t line;                    /* of the last line read, from 1 */
    bool hex;
    char error[256];                  /* why the last call returned -1 */
};
void kvt_reader_init(struct kvt_reader *r, const char *text, size_t len);
int kvt_read_header(struct kvt_reader *r, struct kvt_header *h);       /* 0 or -1 */
/* The next entry into key and value: 1, 0 at DATA=END (and nothing after
 * it), -1 on an error (r->error names the line). */
int kvt_read_entry(struct kvt_reader *r, struct kvt_buf *key, struct kvt_buf *value);
/* Decode one argument (a key or value on the command line, hex or raw). */
int kvt_decode_hex(const char *text, size_t len, struct kvt_buf *out);  /* 0 or -1 */

/* ---- commands ---------------------------------------------------------------- */
int run_ls(const struct args *args);
int run_stat(const struct args *args);
int run_dump(const struct args *args);
int run_load(const struct args *args);
int run_get(const struct args *args);
int run_put(const struct args *args);
int run_rm(const struct args *args);

#endif
