/* cli.c — helpers every `nvheap` command uses: messages, sizes and labels,
 * the key/value (or JSON) emitter, and the progress bar. */
#include "cli.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ==========================================================================
 * Messages
 * ========================================================================== */
/* Print "nvheap: <message>\n" to stderr. */
void cli_vmessage(const char *fmt, va_list ap)
{
    fputs("nvheap: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

/* Print "nvheap: <message>" to stderr; returns EXIT_ERROR. */
int fail_msg(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cli_vmessage(fmt, ap);
    va_end(ap);
    return EXIT_ERROR;
}

/* The library's message for its last failure. */
int fail_lib(void)
{
    return fail_msg("%s", nvh_errormsg());
}

/* ==========================================================================
 * Sizes: "1048576", "64M", "1g", "512KiB", "2MB" (binary multiples)
 * ========================================================================== */
bool parse_size(const char *text, const char *option, uint64_t *out)
{
    const char *p = text;
    uint64_t value = 0;
    if (!isdigit((unsigned char)*p)) {
        fail_msg("invalid %s '%s': expected a number of bytes, optionally followed by "
                 "K, M, G or T", option, text);
        return false;
    }
    for (; isdigit((unsigned char)*p); p++) {
        unsigned digit = (unsigned)(*p - '0');
        if (value > (UINT64_MAX - digit) / 10) goto overflow;
        value = value * 10 + digit;
    }
    unsigned shift = 0;
    switch (tolower((unsigned char)*p)) {
    case 'k': shift = 10; break;
    case 'm': shift = 20; break;
    case 'g': shift = 30; break;
    case 't': shift = 40; break;
    }
    if (shift) p++;
    if (shift && tolower((unsigned char)p[0]) == 'i' && tolower((unsigned char)p[1]) == 'b')
        p += 2;                                         /* KiB, MiB, ... */
    else if (tolower((unsigned char)*p) == 'b')
        p++;                                            /* KB, MB, ... or bare B */
    if (*p != '\0') {
        fail_msg("invalid %s '%s': unknown suffix '%s' (use K, M, G or T, optionally "
                 "followed by B or iB)", option, text, p);
        return false;
    }
    if (shift && value > (UINT64_MAX >> shift)) goto overflow;
    *out = value << shift;
    return true;
overflow:
    fail_msg("invalid %s '%s': does not fit in 64 bits", option, text);
    return false;
}

/* "64 MiB" when the size is an exact multiple of a unit, else "N bytes". */
const char *format_size(uint64_t size, char buf[32])
{
    static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
    for (unsigned i = 0; i < 4; i++) {
        unsigned shift = 40 - 10 * i;
        if (size >= ((uint64_t)1 << shift) && size % ((uint64_t)1 << shift) == 0) {
            snprintf(buf, 32, "%llu %s", (unsigned long long)(size >> shift), units[i]);
            return buf;
        }
    }
    snprintf(buf, 32, "%llu bytes", (unsigned long long)size);
    return buf;
}

const char *format_uuid(const uint8_t uuid[16], char buf[37])
{
    char *p = buf;
    for (unsigned i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) *p++ = '-';
        p += sprintf(p, "%02x", uuid[i]);
    }
    return buf;
}

const char *format_time_utc(uint64_t seconds, char buf[32])
{
    time_t t = (time_t)seconds;
    struct tm tm;
    if (!gmtime_r(&t, &tm) || strftime(buf, 32, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(buf, 32, "@%llu", (unsigned long long)seconds);
    return buf;
}

/* Domain name, or "invalid(N)" for a value no domain has. */
const char *domain_label(nvh_domain domain, char buf[32])
{
    const char *name = nvh_domain_name(domain);
    if (name && domain != NVH_DOMAIN_AUTO) return name;
    snprintf(buf, 32, "invalid(%u)", (unsigned)domain);
    return buf;
}
/* ==========================================================================
 * Output of `info`: "key: value" lines, or one JSON object with the same
 * (kebab-case) keys; numbers stay numbers in JSON.
 * ========================================================================== */

void emit_begin(struct emitter *e)
{
    if (e->json) fputc('{', e->out);
}

/* Two spaces per level: JSON nests one level deeper than the text form,
 * which has no braces around the whole. */
static void emit_indent(struct emitter *e, unsigned levels)
{
    for (unsigned i = 0; i < levels; i++) fputs("  ", e->out);
}

void emit_key(struct emitter *e, const char *key)
{
    if (e->json) {
        fprintf(e->out, "%s\n", e->fields ? "," : "");
        emit_indent(e, e->depth + 1);
        emit_json_string(e->out, key);
        fputs(": ", e->out);
    } else {
        emit_indent(e, e->depth);
        fprintf(e->out, "%s:", key);
    }
    e->fields++;
}

void emit_json_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
        else if (c == '\n') fputs("\\n", out);
        else if (c == '\t') fputs("\\t", out);
        else if (c < 0x20 || c == 0x7f) fprintf(out, "\\u%04x", c);
        else fputc(c, out);
    }
    fputc('"', out);
}

void emit_str(struct emitter *e, const char *key, const char *value)
{
    emit_key(e, key);
    if (e->json) emit_json_string(e->out, value);
    else if (*value) fprintf(e->out, " %s\n", value);
    else fputc('\n', e->out);
}

void emit_u64(struct emitter *e, const char *key, uint64_t value)
{
    emit_key(e, key);
    fprintf(e->out, e->json ? "%llu" : " %llu\n", (unsigned long long)value);
}

void emit_double(struct emitter *e, const char *key, double value, int decimals)
{
    emit_key(e, key);
    fprintf(e->out, e->json ? "%.*f" : " %.*f\n", decimals, value);
}

void emit_open(struct emitter *e, const char *key)
{
    emit_key(e, key);
    fputs(e->json ? "{" : "\n", e->out);
    if (e->depth < sizeof e->saved / sizeof e->saved[0]) e->saved[e->depth] = e->fields;
    e->depth++;
    e->fields = 0;
}

void emit_close(struct emitter *e)
{
    if (!e->depth) return;
    e->depth--;
    if (e->json) {
        if (e->fields) {
            fputc('\n', e->out);
            emit_indent(e, e->depth + 1);
        }
        fputc('}', e->out);
    }
    e->fields = e->depth < sizeof e->saved / sizeof e->saved[0] ? e->saved[e->depth] : 1;
}

void emit_end(struct emitter *e)
{
    if (e->json) fputs(e->fields ? "\n}\n" : "}\n", e->out);
}


/* ==========================================================================
 * Progress bar: "\rdump [#######.....]  52%  523000/1000000" on stderr,
 * redrawn at most 10 times a second; only when stderr is a terminal (or
 * --progress), never with --no-progress, and only for runs long enough to
 * be worth it (the first draw waits half a second).
 * ========================================================================== */
static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void progress_start(struct progress *p, const char *what, uint64_t total, const struct args *a)
{
    p->what = what;
    p->total = total;
    p->done = 0;
    p->forced = a->given[OPT_PROGRESS];
    p->on = p->forced || (!a->given[OPT_NO_PROGRESS] && isatty(2));
    p->drawn = false;
    p->last_ns = p->forced ? 0 : now_ns() + 400000000u;   /* first draw after 0.5 s */
}

static void progress_draw(struct progress *p)
{
    enum { WIDTH = 30 };
    if (p->total) {
        uint64_t done = p->done > p->total ? p->total : p->done;
        unsigned fill = (unsigned)(done * WIDTH / p->total);
        char bar[WIDTH + 1];
        for (unsigned i = 0; i < WIDTH; i++) bar[i] = i < fill ? '#' : '.';
        bar[WIDTH] = '\0';
        fprintf(stderr, "\r%s [%s] %3u%%  %llu/%llu", p->what, bar,
                (unsigned)(done * 100 / p->total), (unsigned long long)p->done,
                (unsigned long long)p->total);
    } else {
        fprintf(stderr, "\r%s  %llu", p->what, (unsigned long long)p->done);
    }
    fflush(stderr);
    p->drawn = true;
}

void progress_step(struct progress *p, uint64_t done)
{
    p->done = done;
    if (!p->on || (done & 255)) return;   /* look at the clock every 256 entries */
    uint64_t t = now_ns();
    if (t < p->last_ns || t - p->last_ns < 100000000u) return;
    p->last_ns = t;
    progress_draw(p);
}

void progress_end(struct progress *p)
{
    if (!p->on || (!p->drawn && !p->forced)) return;   /* a short run: no bar at all */
    progress_draw(p);
    fputc('\n', stderr);
}
