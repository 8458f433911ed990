/* bench_persist.c — cost of a persisted line and of a fence, per domain, vs PMDK
 *
 * ns per operation, per 64 B line and per fence in every persistence domain,
 * next to PMDK's libpmem doing the same work on the same kind of mapping.
 *
 * Cases are GROUP/VARIANT. Groups (nvheap call | PMDK call):
 *   fence              nvh_drain with nothing pending      | pmem_drain
 *   persist_line       8 B store + nvh_persist, the next line each time
 *                      (a sequential walk through the region) | pmem_persist
 *   persist_line_same  the same, always the same (hot) line
 *   flush8_drain       8 stores to 8 lines, 8 nvh_flush, 1 nvh_drain
 *                                                 | 8 pmem_flush + pmem_drain
 *   persist_4k         one store in each line of a 4 KiB block, persist the
 *                      block: 64 lines, one fence       | pmem_persist
 *   memcpy_256         nvh_memcpy_persist 256 B (NT-store path in pmem)
 *                                                 | pmem_memcpy_persist
 *   memcpy_4k          the same, 4 KiB
 *   records_aligned    272 B records (a B+ tree value record of 256 B) written
 *                      and flushed one after another at a 320 B stride (64 B
 *                      aligned, as the tree carves them), a fence per four
 *                                          | pmem_flush, pmem_drain
 *   records_packed     the same at a 272 B stride: each record's first line
 *                      is its predecessor's last, stored to again while that
 *                      line's flush may be in flight. Same lines flushed.
 * Variants: pmem-clwb, pmem-clflushopt, pmem-clflush (those the CPU has),
 * eadr, process, sim, msync.
 *
 * Each variant runs in a child process whose environment fixes both
 * libraries' choices: NVHEAP_FLUSH for nvheap (read at pool open), and
 * PMEM_NO_CLWB / PMEM_NO_CLFLUSHOPT / PMEM_NO_FLUSH / PMEM_IS_PMEM_FORCE for
 * libpmem (read when the library loads, hence a fresh process). PMDK's
 * counterpart of the eadr domain is PMEM_NO_FLUSH=1; of msync, pmem_msync()
 * per persist (what libpmemobj does on a non-pmem file); process and sim have
 * none. nvheap writes into the root area of a pool, PMDK into a
 * pmem_map_file mapping of the same size beside it: /dev/shm (DRAM, where
 * CLWB really runs) for all but msync, which uses a disk file (/var/tmp).
 * nvheap's counters give lines_per_op / fences_per_op / msyncs_per_op.
 */
#include "bench_util.h"

#include <libpmem.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((uint64_t)1 << 20)
#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ==========================================================================
 * Variants: a domain (and flush instruction) plus PMDK's counterpart
 * ========================================================================== */
typedef enum subject_kind {
    SUBJ_NVHEAP = 0,
    SUBJ_PMDK = 1,        /* pmem_flush / pmem_drain / pmem_memcpy_persist */
    SUBJ_PMDK_MSYNC = 2,  /* pmem_msync for every persist or flush          */
    SUBJ_NONE = 3,
} subject_kind;

typedef struct variant {
    const char *label;          /* the VARIANT part of the case names          */
    nvh_domain domain;
    const char *flush;          /* NVHEAP_FLUSH (pmem domain), else NULL       */
    bool on_disk;               /* files on a disk file system (--msync-dir)   */
    subject_kind pmdk;          /* PMDK's counterpart, SUBJ_NONE if none       */
    const char *pmdk_env[5];    /* libpmem's environment for it (NULL-ended)   */
    double time_scale;          /* share of --time one measurement gets        */
} variant;

static const variant variants[] = {
    {"pmem-clwb", NVH_DOMAIN_PMEM, "clwb", false, SUBJ_PMDK,
     {"PMEM_IS_PMEM_FORCE=1", "PMEM_NO_CLWB=0", "PMEM_NO_CLFLUSHOPT=0", "PMEM_NO_FLUSH=0", NULL},
     1.0},
    {"pmem-clflushopt", NVH_DOMAIN_PMEM, "clflushopt", false, SUBJ_PMDK,
     {"PMEM_IS_PMEM_FORCE=1", "PMEM_NO_CLWB=1", "PMEM_NO_CLFLUSHOPT=0", "PMEM_NO_FLUSH=0", NULL},
     1.0},
    {"pmem-clflush", NVH_DOMAIN_PMEM, "clflush", false, SUBJ_PMDK,
     {"PMEM_IS_PMEM_FORCE=1", "PMEM_NO_CLWB=1", "PMEM_NO_CLFLUSHOPT=1", "PMEM_NO_FLUSH=0", NULL},
     1.0},
    {"eadr", NVH_DOMAIN_EADR, NULL, false, SUBJ_PMDK,
     {"PMEM_IS_PMEM_FORCE=1", "PMEM_NO_FLUSH=1", NULL}, 1.0},
    {"process", NVH_DOMAIN_PROCESS, NULL, false, SUBJ_NONE, {NULL}, 1.0},
    {"sim", NVH_DOMAIN_SIM, NULL, false, SUBJ_NONE, {NULL}, 1.0},
    {"msync", NVH_DOMAIN_MSYNC, NULL, true, SUBJ_PMDK_MSYNC, {"PMEM_IS_PMEM_FORCE=0", NULL},
     0.25},
};
#define VARIANT_COUNT (sizeof variants / sizeof variants[0])

static const char *const subject_names[] = {"nvheap", "pmdk", "pmdk"};

/* ==========================================================================
 * The region under test and the operations of each subject
 * ========================================================================== */
typedef struct space {
    char *base;                 /* region start, 4 KiB aligned                 */
    uint64_t size;              /* a power of two                              */
    uint64_t cursor;            /* offset of the next write                    */
    nvh_pool *pool;             /* the nvheap subject's pool, else NULL        */
    unsigned char *src;         /* 4 KiB source of the copies                  */
} space;

/* The next `unit`-aligned slot of `unit` bytes: a sequential walk through the
 * region, wrapping at its end, so every operation writes fresh lines. */
ALWAYS_INLINE char *next_slot(space *s, uint64_t unit)
{
    uint64_t off = ((s->cursor + unit - 1) & ~(unit - 1)) & (s->size - 1);
    s->cursor = off + unit;
    return s->base + off;
}

/* `kind` is a constant in every instantiation below, so each body compiles
 * to straight calls of one library: nvheap's inline paths stay inline. */
ALWAYS_INLINE void op_flush(subject_kind kind, space *s, const void *p, size_t len)
{
    if (kind == SUBJ_NVHEAP) nvh_flush(s->pool, p, len);
    else if (kind == SUBJ_PMDK) pmem_flush(p, len);
    else (void)pmem_msync(p, len);
}

ALWAYS_INLINE void op_drain(subject_kind kind, space *s)
{
    if (kind == SUBJ_NVHEAP) nvh_drain(s->pool);
    else if (kind == SUBJ_PMDK) pmem_drain();
    /* SUBJ_PMDK_MSYNC: every pmem_msync was already synchronous */
}

ALWAYS_INLINE void op_persist(subject_kind kind, space *s, const void *p, size_t len)
{
    if (kind == SUBJ_NVHEAP) nvh_persist(s->pool, p, len);
    else if (kind == SUBJ_PMDK) pmem_persist(p, len);
    else (void)pmem_msync(p, len);
}

ALWAYS_INLINE void op_memcpy_persist(subject_kind kind, space *s, void *dst, const void *src,
                                     size_t len)
{
    if (kind == SUBJ_NVHEAP) nvh_memcpy_persist(s->pool, dst, src, len);
    else if (kind == SUBJ_PMDK) pmem_memcpy_persist(dst, src, len);
    else {
        memcpy(dst, src, len);
        (void)pmem_msync(dst, len);
    }
}

/* ==========================================================================
 * Case bodies
 * ========================================================================== */
ALWAYS_INLINE void body_fence(subject_kind kind, void *ctx, uint64_t iters)
{
    space *s = ctx;
    for (uint64_t i = 0; i < iters; i++) op_drain(kind, s);
}

ALWAYS_INLINE void body_persist_line(subject_kind kind, void *ctx, uint64_t iters)
{
    space *s = ctx;
    for (uint64_t i = 0; i < iters; i++) {
        volatile uint64_t *p = (volatile uint64_t *)next_slot(s, NVH_CACHELINE);
        *p = i;
        op_persist(kind, s, (const void *)p, sizeof *p);
    }
}

ALWAYS_INLINE void body_persist_line_same(subject_kind kind, void *ctx, uint64_t iters)
{
    space *s = ctx;
    volatile uint64_t *p = (volatile uint64_t *)s->base;
    for (uint64_t i = 0; i < iters; i++) {
        *p = i;
        op_persist(kind, s, (const void *)p, sizeof *p);
    }
}

ALWAYS_INLINE void body_flush8_drain(subject_kind kind, void *ctx, uint64_t iters)
{
    space *s = ctx;
    for (uint64_t i = 0; i < iters; i++) {
        for (unsigned j = 0; j < 8; j++) {
            volatile uint64_t *p = (volatile uint64_t *)next_slot(s, NVH_CACHELINE);
            *p = i;
            op_flush(kind, s, (const void *)p, sizeof *p);
        }
        op_drain(kind, s);
    }
}

ALWAYS_INLINE void body_persist_4k(subject_kind kind, void *ctx, uint64_t iters)
{
    space *s = ctx;
    for (uint64_t i = 0; i < iters; i++) {
        char *block = next_slot(s, 4096);
        for (unsigned line = 0; line < 4096 / NVH_CACHELINE; line++)
            *(volatile uint64_t *)(block + line * NVH_CACHELINE) = i;
        op_persist(kind, s, block, 4096);
    }
}

ALWAYS_INLINE void body_memcpy(subject_kind kind, void *ctx, uint64_t iters, size_t len)
{
    space *s = ctx;
    for (uint64_t i = 0; i < iters; i++) {
        char *dst = next_slot(s, len);
        memcpy(s->src, &i, sizeof i);           /* a fresh value every time */
        op_memcpy_persist(kind, s, dst, s->src, len);
    }
}

ALWAYS_INLINE void body_memcpy_256(subject_kind kind, void *ctx, uint64_t iters)
{
    body_memcpy(kind, ctx, iters, 256);
}

ALWAYS_INLINE void body_memcpy_4k(subject_kind kind, void *ctx, uint64_t iters)
{
    body_memcpy(kind, ctx, iters, 4096);
}

/* Records written back to back (records_aligned / records_packed): the
 * price of storing to a line whose write-back was just issued. Why the B+
 * tree keeps its value records 64 B aligned (docs/BTREE.md). */
#define RECORD_BYTES 272u
ALWAYS_INLINE void body_records(subject_kind kind, void *ctx, uint64_t iters, uint64_t stride)
{
    space *s = ctx;
    s->cursor = (s->cursor + NVH_CACHELINE - 1) & ~(uint64_t)(NVH_CACHELINE - 1);
    for (uint64_t i = 0; i < iters; i++) {
        if (s->cursor + stride > s->size) s->cursor = 0;
        char *record = s->base + s->cursor;
        s->cursor += stride;
        memset(record, (int)(i & 0xff), RECORD_BYTES);
        op_flush(kind, s, record, RECORD_BYTES);
        if ((i & 3) == 3) op_drain(kind, s);
    }
    op_drain(kind, s);
}

ALWAYS_INLINE void body_records_aligned(subject_kind kind, void *ctx, uint64_t iters)
{
    body_records(kind, ctx, iters, (RECORD_BYTES + NVH_CACHELINE - 1) & ~(NVH_CACHELINE - 1u));
}

ALWAYS_INLINE void body_records_packed(subject_kind kind, void *ctx, uint64_t iters)
{
    body_records(kind, ctx, iters, RECORD_BYTES);
}

/* One out-of-line function per (body, subject); a case table may leave one
 * unused (fence has no pmem_msync form). */
#define INSTANTIATE(body)                                                                  \
    __attribute__((unused)) static void body##_nvheap(void *ctx, uint64_t n)               \
    { body(SUBJ_NVHEAP, ctx, n); }                                                         \
    __attribute__((unused)) static void body##_pmdk(void *ctx, uint64_t n)                 \
    { body(SUBJ_PMDK, ctx, n); }                                                           \
    __attribute__((unused)) static void body##_pmdk_msync(void *ctx, uint64_t n)           \
    { body(SUBJ_PMDK_MSYNC, ctx, n); }
INSTANTIATE(body_fence)
INSTANTIATE(body_persist_line)
INSTANTIATE(body_persist_line_same)
INSTANTIATE(body_flush8_drain)
INSTANTIATE(body_persist_4k)
INSTANTIATE(body_memcpy_256)
INSTANTIATE(body_memcpy_4k)
INSTANTIATE(body_records_aligned)
INSTANTIATE(body_records_packed)

typedef struct persist_case {
    const char *group;
    bench_body_fn body[3];      /* indexed by subject_kind; NULL = no such case */
} persist_case;

#define BODIES(body) {body##_nvheap, body##_pmdk, body##_pmdk_msync}
static const persist_case cases[] = {
    {"fence", {body_fence_nvheap, body_fence_pmdk, NULL}},  /* pmem_msync has no fence */
    {"persist_line", BODIES(body_persist_line)},
    {"persist_line_same", BODIES(body_persist_line_same)},
    {"flush8_drain", BODIES(body_flush8_drain)},
    {"persist_4k", BODIES(body_persist_4k)},
    {"memcpy_256", BODIES(body_memcpy_256)},
    {"memcpy_4k", BODIES(body_memcpy_4k)},
    {"records_aligned", BODIES(body_records_aligned)},
    {"records_packed", BODIES(body_records_packed)},
};
#define CASE_COUNT (sizeof cases / sizeof cases[0])

/* ==========================================================================
 * Measuring
 * ========================================================================== */
typedef struct settings {
    uint64_t region;            /* bytes each subject writes through           */
    const char *msync_dir;      /* where the msync variant's files live        */
} settings;

static void case_name(char *buf, size_t size, const persist_case *pc, const variant *v)
{
    snprintf(buf, size, "%s/%s", pc->group, v->label);
}

static bool variant_selected(const bench_opts *opts, const variant *v)
{
    char name[128];
    for (size_t c = 0; c < CASE_COUNT; c++) {
        case_name(name, sizeof name, &cases[c], v);
        if (bench_selected(opts, name)) return true;
    }
    return false;
}

/* Emit ns_per_op and, when the op flushes lines, ns_per_line. */
static void emit_times(const bench_opts *opts, const char *name, const char *subject,
                       const double *ns_per_op, unsigned runs, double lines_per_op)
{
    bench_emit(opts, name, subject, "ns_per_op", bench_summarize(ns_per_op, runs), "ns");
    if (lines_per_op <= 0) return;
    double *per_line = malloc(runs * sizeof *per_line);
    if (!per_line) return;
    for (unsigned r = 0; r < runs; r++) per_line[r] = ns_per_op[r] / lines_per_op;
    bench_emit(opts, name, subject, "ns_per_line", bench_summarize(per_line, runs), "ns");
    free(per_line);
}

/* Run one case: nvheap and PMDK alternate within every repetition (so drift
 * on a shared machine hits both alike) with the same iteration count. */
static void run_case(const bench_opts *opts, const variant *v, const persist_case *pc,
                     space *nvh, space *pmdk)
{
    char name[128];
    case_name(name, sizeof name, pc, v);
    if (!bench_selected(opts, name)) return;
    bench_body_fn nvh_body = pc->body[SUBJ_NVHEAP];
    bench_body_fn pmdk_body = pmdk && v->pmdk != SUBJ_NONE ? pc->body[v->pmdk] : NULL;

    uint64_t iters = bench_calibrate(opts, nvh_body, nvh, v->time_scale);
    if (pmdk_body) pmdk_body(pmdk, iters / 8 + 1);       /* warm up like calibration did */

    unsigned runs = opts->runs;
    double *nvh_ns = calloc(runs, sizeof *nvh_ns), *pmdk_ns = calloc(runs, sizeof *pmdk_ns);
    if (!nvh_ns || !pmdk_ns) {
        bench_error(opts, "out of memory");
        free(nvh_ns);
        free(pmdk_ns);
        return;
    }
    bench_counts counts = {0};
    for (unsigned r = 0; r < runs; r++) {
        bool pmdk_first = r % 2 == 1;
        if (pmdk_body && pmdk_first) pmdk_ns[r] = bench_time_ns(pmdk_body, pmdk, iters) / iters;
        bench_counts_begin(nvh->pool);
        nvh_ns[r] = bench_time_ns(nvh_body, nvh, iters) / iters;
        counts = bench_counts_per_op(nvh->pool, iters);
        if (pmdk_body && !pmdk_first) pmdk_ns[r] = bench_time_ns(pmdk_body, pmdk, iters) / iters;
    }
    emit_times(opts, name, "nvheap", nvh_ns, runs, counts.lines_per_op);
    bench_emit_counts(opts, name, "nvheap", &counts);
    /* PMDK flushes the same lines: ns_per_line uses nvheap's count */
    if (pmdk_body) emit_times(opts, name, subject_names[v->pmdk], pmdk_ns, runs, counts.lines_per_op);
    free(nvh_ns);
    free(pmdk_ns);
}

/* Set up both subjects' regions for one variant, run its cases, clean up. */
static void run_variant(const bench_opts *opts, const settings *set, const variant *v)
{
    const char *dir = v->on_disk ? set->msync_dir : opts->dir;
    uint64_t size = set->region;
    if (v->on_disk) size = size / 8 < MIB ? MIB : size / 8;   /* msync is slow: less */
    char tag[64];
    nvh_pool *pool = NULL;
    void *pm = NULL;
    size_t pm_len = 0;
    unsigned char *src = aligned_alloc(64, 4096);
    if (!src) {
        bench_error(opts, "out of memory");
        return;
    }
    memset(src, 0x5a, 4096);

    /* ---- nvheap: a pool whose root area is the region ---- */
    if (v->flush) setenv("NVHEAP_FLUSH", v->flush, 1);
    snprintf(tag, sizeof tag, "%s.pool", v->label);
    const char *pool_path = bench_scratch_path(opts, dir, tag);
    if (!pool_path) goto out;
    nvh_pool_options po = {.root_size = size};
    pool = nvh_pool_create_ex(pool_path, "bench_persist", size + 2 * MIB, v->domain, &po);
    if (!pool) {
        bench_error(opts, "%s: %s", v->label, nvh_errormsg());
        goto out;
    }
    nvh_pool_info info;
    nvh_pool_info_get(pool, &info);
    if (info.domain != v->domain) {
        bench_error(opts, "%s: pool opened in the %s domain", v->label,
                    nvh_domain_name(info.domain));
        goto out;
    }
    if (v->flush && strcmp(info.flush_instruction, v->flush) != 0) {
        bench_note(opts, "%s: skipped, this CPU has no %s", v->label, v->flush);
        goto out;
    }
    space nvh = {.base = nvh_root(pool, NULL), .size = size, .pool = pool, .src = src};
    memset(nvh.base, 0, size);                      /* prefault */
    nvh_persist(pool, nvh.base, size);

    /* ---- PMDK: a pmem_map_file mapping of the same size beside it ---- */
    space pmdk = {.size = size, .src = src};
    char pmdk_desc[160] = "pmdk: no counterpart";
    if (v->pmdk != SUBJ_NONE) {
        snprintf(tag, sizeof tag, "%s.pmdk", v->label);
        const char *pm_path = bench_scratch_path(opts, dir, tag);
        int is_pmem = 0;
        pm = pm_path ? pmem_map_file(pm_path, size, PMEM_FILE_CREATE | PMEM_FILE_EXCL, 0600,
                                     &pm_len, &is_pmem)
                     : NULL;
        if (!pm) {
            bench_error(opts, "%s: pmem_map_file %s: %s", v->label, pm_path ? pm_path : "",
                        pmem_errormsg());
            goto out;
        }
        bench_scratch_remove(pm_path);              /* the mapping keeps it alive */
        int pmem_now = pmem_is_pmem(pm, pm_len);
        if (v->pmdk == SUBJ_PMDK && !pmem_now) {
            bench_error(opts, "%s: pmem_is_pmem() = 0 although PMEM_IS_PMEM_FORCE=1: "
                        "libpmem would not flush like our pmem domain", v->label);
            goto out;
        }
        pmdk.base = pm;
        memset(pmdk.base, 0, size);
        if (v->pmdk == SUBJ_PMDK) pmem_persist(pmdk.base, size);
        else (void)pmem_msync(pmdk.base, size);
        int used = snprintf(pmdk_desc, sizeof pmdk_desc, "pmdk: %s, pmem_is_pmem()=%d, env",
                            v->pmdk == SUBJ_PMDK_MSYNC ? "pmem_msync" : "pmem_persist", pmem_now);
        for (unsigned e = 0; v->pmdk_env[e] && used > 0 && (size_t)used < sizeof pmdk_desc; e++)
            used += snprintf(pmdk_desc + used, sizeof pmdk_desc - (size_t)used, " %s",
                             v->pmdk_env[e]);
    }
    bench_note(opts, "%-16s nvheap: %s domain%s%s, %llu MiB in %s; %s", v->label,
               nvh_domain_name(info.domain), v->flush ? ", " : "", v->flush ? v->flush : "",
               (unsigned long long)(size / MIB), dir, pmdk_desc);

    for (size_t c = 0; c < CASE_COUNT; c++)
        run_case(opts, v, &cases[c], &nvh, v->pmdk != SUBJ_NONE ? &pmdk : NULL);

out:
    if (pool) nvh_pool_close(pool);
    if (pool_path) bench_scratch_remove(pool_path);
    if (pm) pmem_unmap(pm, pm_len);
    free(src);
}

/* ==========================================================================
 * Main: the parent runs each selected variant in a child with its environment
 * ========================================================================== */
static const bench_info info = {
    .name = "persist",
    .summary = "cost of a persisted line and of a fence, every domain, vs PMDK libpmem",
    .baseline = "pmdk",
    .ratio_metric = "ns_per_op",
    .usage =
        "  --variants LIST    comma-separated variants to run (default: all of\n"
        "                     pmem-clwb,pmem-clflushopt,pmem-clflush,eadr,process,sim,msync)\n"
        "  --region MIB       region each subject writes through, a power of two\n"
        "                     (default 64, quick 16; msync uses 1/8 of it)\n"
        "  --msync-dir PATH   disk directory for the msync variant\n"
        "                     (default $NVHEAP_BENCH_MSYNC_DIR or /var/tmp)\n"
        "  --variant NAME     run one variant in this process (what the children do;\n"
        "                     libpmem then keeps this process's environment)\n",
};

static const variant *find_variant(const char *label, size_t len)
{
    for (size_t i = 0; i < VARIANT_COUNT; i++)
        if (strlen(variants[i].label) == len && strncmp(variants[i].label, label, len) == 0)
            return &variants[i];
    return NULL;
}

int main(int argc, char **argv)
{
    bench_opts opts;
    bench_parse(&opts, &info, argc, argv);

    const char *only_variants = NULL, *one_variant = NULL, *region_text = NULL;
    settings set = {.region = (opts.quick ? 16 : 64) * MIB};
    set.msync_dir = getenv("NVHEAP_BENCH_MSYNC_DIR");
    if (!set.msync_dir || !*set.msync_dir) set.msync_dir = "/var/tmp";
    for (int i = 0; i < opts.argc; i++) {
        const char *arg = opts.argv[i];
        bool has_value = i + 1 < opts.argc;
        if (strcmp(arg, "--variants") == 0 && has_value) only_variants = opts.argv[++i];
        else if (strcmp(arg, "--variant") == 0 && has_value) one_variant = opts.argv[++i];
        else if (strcmp(arg, "--region") == 0 && has_value) region_text = opts.argv[++i];
        else if (strcmp(arg, "--msync-dir") == 0 && has_value) set.msync_dir = opts.argv[++i];
        else bench_usage_error(&opts, "unknown option or missing value: %s", arg);
    }
    if (region_text) {
        char *end;
        unsigned long long mib = strtoull(region_text, &end, 10);
        if (*end || mib == 0 || (mib & (mib - 1)) || mib > 4096)
            bench_usage_error(&opts, "--region: '%s' is not a power of two 1..4096", region_text);
        set.region = mib * MIB;
    }
    char region_arg[32];
    snprintf(region_arg, sizeof region_arg, "%llu", (unsigned long long)(set.region / MIB));

    if (one_variant) {
        const variant *v = find_variant(one_variant, strlen(one_variant));
        if (!v) bench_usage_error(&opts, "unknown variant '%s'", one_variant);
        run_variant(&opts, &set, v);
        return bench_finish(&opts);
    }

    bool wanted[VARIANT_COUNT];
    for (size_t i = 0; i < VARIANT_COUNT; i++) wanted[i] = only_variants == NULL;
    for (const char *p = only_variants; p && *p;) {
        size_t len = strcspn(p, ",");
        const variant *v = find_variant(p, len);
        if (!v) bench_usage_error(&opts, "unknown variant '%.*s'", (int)len, p);
        wanted[v - variants] = true;
        p += len + (p[len] == ',');
    }

    bench_note(&opts, "nvheap detects %s on this CPU; %u run%s per figure, %.0f ms each%s",
               nvh_flush_kind_name(nvh_flush_kind_detect()), opts.runs,
               opts.runs == 1 ? "" : "s", opts.time_ns / 1e6,
               opts.quick ? " (quick)" : "");
    for (size_t i = 0; i < VARIANT_COUNT; i++) {
        const variant *v = &variants[i];
        if (!wanted[i] || !variant_selected(&opts, v)) continue;
        const char *env[8];
        unsigned n = 0;
        char flush_env[32];
        if (v->flush) {
            snprintf(flush_env, sizeof flush_env, "NVHEAP_FLUSH=%s", v->flush);
            env[n++] = flush_env;
        }
        for (unsigned e = 0; v->pmdk_env[e]; e++) env[n++] = v->pmdk_env[e];
        env[n] = NULL;
        const char *args[] = {"--variant", v->label, "--region", region_arg,
                              "--msync-dir", set.msync_dir, NULL};
        bench_run_child(&opts, env, args);
    }
    return bench_finish(&opts);
}
