/* test_guide.c — docs/GUIDE.md quotes the programs in examples/, which the
 * examples tests build and run: this test keeps the quotes true. For every
 * ```c block that follows "From `examples/NAME.c`" (the next block after
 * it), each code line (its
 * comments and a trailing ';' dropped, blanks trimmed) must occur in some
 * line of that file (comments dropped as well), so the guide cannot show a
 * call the tested program does not make. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef NVHEAP_SOURCE_DIR
#error "NVHEAP_SOURCE_DIR must name the source tree"
#endif

/* The whole file as a NUL-terminated string, or NULL. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    if (buf) buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Copy line [s, e) into out without its comments and surrounding blanks and
 * without a trailing ';'. */
static void clean_line(const char *s, const char *e, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = s; p < e && n + 1 < cap; p++) {
        if (p + 1 < e && p[0] == '/' && p[1] == '*') {
            const char *end = strstr(p + 2, "*/");
            if (!end || end >= e) break;
            p = end + 1;
            continue;
        }
        out[n++] = *p;
    }
    out[n] = '\0';
    while (n && (out[n - 1] == ' ' || out[n - 1] == '\t' || out[n - 1] == '\r')) out[--n] = '\0';
    if (n && out[n - 1] == ';') out[--n] = '\0';
    while (n && out[n - 1] == ' ') out[--n] = '\0';
    size_t lead = strspn(out, " \t");
    memmove(out, out + lead, n - lead + 1);
}

/* 1 if `needle` occurs in some comment-free line of `text`. */
static int in_some_line(const char *text, const char *needle)
{
    char line[1024];
    for (const char *s = text; *s;) {
        const char *e = strchr(s, '\n');
        if (!e) e = s + strlen(s);
        clean_line(s, e, line, sizeof line);
        if (strstr(line, needle)) return 1;
        s = *e ? e + 1 : e;
    }
    return 0;
}

/* Check every quoted block of guide; returns the number of missing lines
 * (printed) and sets *blocks to the number of blocks checked. */
static int check_guide(const char *guide, unsigned *blocks)
{
    int missing = 0;
    *blocks = 0;
    for (const char *p = strstr(guide, "From"); p; p = strstr(p + 1, "From")) {
        const char *name = p + 4;
        name += strspn(name, " \n");          /* the sentence may wrap */
        if (strncmp(name, "`examples/", 10) != 0) continue;
        name++;
        const char *tick = strchr(name, '`');
        const char *open = strstr(p, "```c\n");
        if (!tick || !open) break;
        const char *code = open + 5, *close = strstr(code, "```");
        if (!close) break;
        char rel[256], path[1024];
        snprintf(rel, sizeof rel, "%.*s", (int)(tick - name), name);
        snprintf(path, sizeof path, "%s/%s", NVHEAP_SOURCE_DIR, rel);
        char *src = slurp(path);
        if (!src) { fprintf(stderr, "  %s: cannot read\n", path); missing++; continue; }
        (*blocks)++;
        char line[1024];
        for (const char *s = code; s < close;) {
            const char *e = memchr(s, '\n', (size_t)(close - s));
            if (!e) e = close;
            clean_line(s, e, line, sizeof line);
            if (line[0] && !in_some_line(src, line)) {
                fprintf(stderr, "  GUIDE.md quotes a line %s does not have: %s\n", rel, line);
                missing++;
            }
            s = e + 1;
        }
        free(src);
        p = close;
    }
    return missing;
}

static void test_guide_quotes_the_examples(void **state)
{
    (void)state;
    char *guide = slurp(NVHEAP_SOURCE_DIR "/docs/GUIDE.md");
    assert_non_null(guide);
    unsigned blocks;
    assert_int_equal(check_guide(guide, &blocks), 0);
    assert_true(blocks >= 5);                 /* pool, alloc, tx, B+ tree, hash map */
    free(guide);
}

/* Negative control: a guide that quotes a call the example does not make
 * is caught. */
static void test_a_wrong_quote_is_caught(void **state)
{
    (void)state;
    const char *guide = "From `examples/alloc_list.c`:\n\n```c\n"
                        "nvh_off_t *links[] = {&root->head};\n"
                        "nvh_activate(pool, n, links, 2);   /* not what it calls */\n```\n";
    unsigned blocks;
    assert_int_equal(check_guide(guide, &blocks), 1);
    assert_int_equal(blocks, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_guide_quotes_the_examples),
        cmocka_unit_test(test_a_wrong_quote_is_caught),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
