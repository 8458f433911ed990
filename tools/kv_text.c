/* kv_text.c — the text format of `nvheap dump` / `nvheap load` (cli.h,
 * docs/CLI.md "Dump format"): a header of key=value lines, then one line
 * per key and one per value, each after one space, then DATA=END. Like
 * mdb_dump's: binary keys and values round-trip, the printable form stays
 * readable and diffable, and a truncated file is recognised (the header
 * says how many entries follow, and the last line must be DATA=END). */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

void kvt_buf_free(struct kvt_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

static bool buf_reserve(struct kvt_buf *b, size_t need)
{
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

/* ==========================================================================
 * Writing
 * ========================================================================== */
static const char hexdigits[] = "0123456789abcdef";

static inline bool printable(unsigned char c)
{
    return c >= 0x20 && c <= 0x7e && c != '\\';
}

/* The bytes encoded, without the leading space and the newline. */
static int write_encoded(FILE *out, bool hex, const unsigned char *p, size_t len)
{
    char chunk[4096];
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = p[i];
        if (n > sizeof chunk - 4) {
            if (fwrite(chunk, 1, n, out) != n) return -1;
            n = 0;
        }
        if (!hex && printable(c)) {
            chunk[n++] = (char)c;
        } else if (!hex && c == '\\') {
            chunk[n++] = '\\';
            chunk[n++] = '\\';
        } else {
            if (!hex) chunk[n++] = '\\';
            chunk[n++] = hexdigits[c >> 4];
            chunk[n++] = hexdigits[c & 15];
        }
    }
    return n && fwrite(chunk, 1, n, out) != n ? -1 : 0;
}

int kvt_write_header(FILE *out, const struct kvt_header *h)
{
    if (fprintf(out, KVT_MAGIC_LINE "\nformat=%s\nengine=%s\nstore=",
                h->hex ? "bytevalue" : "print", h->engine) < 0)
        return -1;
    if (write_encoded(out, h->hex, (const unsigned char *)h->store, strlen(h->store)) != 0)
        return -1;
    return fprintf(out, "\nentries=%llu\nHEADER=END\n", (unsigned long long)h->entries) < 0
               ? -1 : 0;
}

int kvt_write_data(FILE *out, bool hex, const void *data, size_t len)
{
    if (fputc(' ', out) == EOF) return -1;
    if (write_encoded(out, hex, data, len) != 0) return -1;
    return fputc('\n', out) == EOF ? -1 : 0;
}

int kvt_write_end(FILE *out)
{
    return fputs("DATA=END\n", out) == EOF ? -1 : 0;
}

/* ==========================================================================
 * Reading
 * ========================================================================== */
void kvt_reader_init(struct kvt_reader *r, const char *text, size_t len)
{
    memset(r, 0, sizeof *r);
    r->p = text;
    r->end = text + len;
}

static int reader_fail(struct kvt_reader *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int reader_fail(struct kvt_reader *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(r->error, sizeof r->error, "line %llu: ", (unsigned long long)r->line);
    if (n < 0) n = 0;
    if ((size_t)n < sizeof r->error) vsnprintf(r->error + n, sizeof r->error - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

/* The next line, without its '\n'. false at the end of the input. A last
 * line without '\n' is a truncated file. */
static bool next_line(struct kvt_reader *r, const char **line, size_t *len, bool *complete)
{
    if (r->p >= r->end) return false;
    const char *nl = memchr(r->p, '\n', (size_t)(r->end - r->p));
    *line = r->p;
    *complete = nl != NULL;
    *len = nl ? (size_t)(nl - r->p) : (size_t)(r->end - r->p);
    r->p = nl ? nl + 1 : r->end;
    r->line++;
    return true;
}

static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decode text[0..len) in the given format into out. NULL on success, else
 * what is wrong (at *at, the byte index in text). */
static const char *decode(const char *text, size_t len, bool hex, struct kvt_buf *out,
                          size_t *at)
{
    out->len = 0;
    if (!buf_reserve(out, len + 1)) return "out of memory";
    const unsigned char *t = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        *at = i;
        if (hex) {
            if (i + 1 >= len) return "odd number of hex digits";
            int a = hexval(t[i]), b = hexval(t[i + 1]);
            if (a < 0 || b < 0) return "not a hex digit";
            out->p[out->len++] = (unsigned char)(a << 4 | b);
            i += 2;
        } else if (t[i] == '\\') {
            if (i + 1 < len && t[i + 1] == '\\') {
                out->p[out->len++] = '\\';
                i += 2;
                continue;
            }
            if (i + 2 >= len) return "'\\' not followed by two hex digits or '\\'";
            int a = hexval(t[i + 1]), b = hexval(t[i + 2]);
            if (a < 0 || b < 0) return "'\\' not followed by two hex digits or '\\'";
            out->p[out->len++] = (unsigned char)(a << 4 | b);
            i += 3;
        } else if (t[i] < 0x20 || t[i] > 0x7e) {
            return "byte that is not printable (must be written as \\xx)";
        } else {
            out->p[out->len++] = t[i++];
        }
    }
    return NULL;
}

int kvt_decode_hex(const char *text, size_t len, struct kvt_buf *out)
{
    size_t at = 0;
    return decode(text, len, true, out, &at) ? -1 : 0;
}

static bool parse_u64(const char *s, size_t len, uint64_t *out)
{
    uint64_t v = 0;
    if (len == 0 || len > 20) return false;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

int kvt_read_header(struct kvt_reader *r, struct kvt_header *h)
{
    memset(h, 0, sizeof *h);
    const char *line;
    size_t len;
    bool complete, have_format = false, have_entries = false;
    if (!next_line(r, &line, &len, &complete) || !complete ||
        len != strlen(KVT_MAGIC_LINE) || memcmp(line, KVT_MAGIC_LINE, len) != 0)
        return reader_fail(r, "not an nvheap dump (the first line must be " KVT_MAGIC_LINE ")");
    const char *store = NULL;
    size_t store_len = 0;
    uint64_t store_line = 0;
    for (;;) {
        if (!next_line(r, &line, &len, &complete) || !complete)
            return reader_fail(r, "the header ends before HEADER=END (truncated dump)");
        if (len == 10 && memcmp(line, "HEADER=END", 10) == 0) break;
        const char *eq = memchr(line, '=', len);
        if (!eq) return reader_fail(r, "header line without '=': '%.*s'", (int)len, line);
        size_t klen = (size_t)(eq - line), vlen = len - klen - 1;
        const char *v = eq + 1;
#define IS(k) (klen == strlen(k) && memcmp(line, k, klen) == 0)
        if (IS("format")) {
            if (vlen == 5 && memcmp(v, "print", 5) == 0) h->hex = false;
            else if (vlen == 9 && memcmp(v, "bytevalue", 9) == 0) h->hex = true;
            else return reader_fail(r, "format '%.*s' (expected print or bytevalue)", (int)vlen, v);
            have_format = true;
        } else if (IS("engine")) {
            if (vlen >= sizeof h->engine) return reader_fail(r, "engine name too long");
            memcpy(h->engine, v, vlen);
            h->engine[vlen] = '\0';
        } else if (IS("store")) {
            store = v;
            store_len = vlen;
            store_line = r->line;
        } else if (IS("entries")) {
            if (!parse_u64(v, vlen, &h->entries))
                return reader_fail(r, "entries '%.*s' is not a number", (int)vlen, v);
            have_entries = true;
        }
        /* other keys: written by a later version; ignored */
#undef IS
    }
    if (!have_format) return reader_fail(r, "the header has no format= line");
    if (!have_entries) return reader_fail(r, "the header has no entries= line");
    if (store) {
        struct kvt_buf b = {0};
        size_t at = 0;
        const char *why = decode(store, store_len, h->hex, &b, &at);
        if (!why && b.len > NVH_KV_NAME_MAX) why = "store name too long";
        if (!why && memchr(b.p, '\0', b.len)) why = "store name contains a NUL byte";
        if (why) {
            kvt_buf_free(&b);
            r->line = store_line;
            return reader_fail(r, "store=: %s", why);
        }
        memcpy(h->store, b.p, b.len);
        h->store[b.len] = '\0';
        kvt_buf_free(&b);
    }
    r->hex = h->hex;
    return 0;
}

static int read_data_line(struct kvt_reader *r, struct kvt_buf *out, const char *what)
{
    const char *line;
    size_t len;
    bool complete;
    if (!next_line(r, &line, &len, &complete))
        return reader_fail(r, "the input ends before DATA=END (truncated dump)");
    if (!complete) return reader_fail(r, "the last line has no newline (truncated dump)");
    if (len == 8 && memcmp(line, "DATA=END", 8) == 0) {
        if (*what == 'v') return reader_fail(r, "DATA=END where a value was expected");
        return 0;
    }
    if (len == 0 || line[0] != ' ')
        return reader_fail(r, "a %s line must begin with one space", what);
    size_t at = 0;
    const char *why = decode(line + 1, len - 1, r->hex, out, &at);
    if (why) return reader_fail(r, "%s, column %zu: %s", what, at + 2, why);
    return 1;
}

int kvt_read_entry(struct kvt_reader *r, struct kvt_buf *key, struct kvt_buf *value)
{
    int rc = read_data_line(r, key, "key");
    if (rc <= 0) {
        if (rc == 0 && r->p != r->end)
            return reader_fail(r, "data after DATA=END");
        return rc;
    }
    rc = read_data_line(r, value, "value");
    return rc < 0 ? rc : 1;
}
