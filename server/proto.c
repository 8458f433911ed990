/* proto.c — memcached's text protocol and meta commands over the store.
 *
 * Replies follow memcached 1.6.18 byte for byte where the tests compare
 * them (tests/server). A change is acknowledged only after the store call
 * that made it returned, and store calls are durable on return, so every
 * STORED / DELETED / HD / new incr value the client reads is durable.
 *
 * Input is consumed one complete command at a time; a partial line or data
 * block waits in the connection's input buffer, whose size main.c bounds.
 * Errors mirror memcached: a malformed command line gets ERROR or
 * CLIENT_ERROR and the next line is read as a command; a line over the
 * limit or the binary protocol's magic byte gets an error and a close. */
#include "nvcached.h"


#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MAX_TOKENS 48
#define REALTIME_MAXDELTA (60 * 60 * 24 * 30)

enum { CMD_SET = 1, CMD_ADD, CMD_REPLACE, CMD_APPEND, CMD_PREPEND, CMD_CAS };

typedef struct tok {
    char *s;
    size_t n;
} tok;

/* ---- output ------------------------------------------------------------- */

static void out(nvc_conn *c, const void *s, size_t n)
{
    nvc_out(c, s, n);
}
#define OUTS(c, lit) out((c), (lit), sizeof(lit) - 1)

static void outf(nvc_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(nvc_conn *c, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0)
        out(c, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

/* ---- numbers (strict, as memcached's safe_strto*) ----------------------- */

static bool parse_u64(const tok *t, uint64_t *v)
{
    if (t->n == 0 || t->n > 20)
        return false;
    uint64_t x = 0;
    for (size_t i = 0; i < t->n; i++) {
        unsigned d = (unsigned char)t->s[i] - '0';
        if (d > 9 || x > (UINT64_MAX - d) / 10)
            return false;
        x = x * 10 + d;
    }
    *v = x;
    return true;
}

static bool parse_u32(const tok *t, uint32_t *v)
{
    uint64_t x;
    if (!parse_u64(t, &x) || x > UINT32_MAX)
        return false;
    *v = (uint32_t)x;
    return true;
}

static bool parse_i32(const tok *t, int64_t *v)
{
    tok u = *t;
    bool neg = u.n > 0 && u.s[0] == '-';
    if (neg)
        u.s++, u.n--;
    uint64_t x;
    if (!parse_u64(&u, &x) || x > (neg ? 2147483648ull : 2147483647ull))
        return false;
    *v = neg ? -(int64_t)x : (int64_t)x;
    return true;
}

/* memcached's realtime(): 0 = never; negative = already expired; over 30
 * days = an absolute Unix time (expired if before the server started);
 * otherwise relative to now. Stored absolute, so it holds across restarts. */
static int64_t abs_time(int64_t e, int64_t now)
{
    if (e == 0)
        return 0;
    if (e < 0)
        return 1;
    if (e > REALTIME_MAXDELTA)
        return e <= nvc_srv.started ? 1 : e;
    return now + e;
}

static int64_t ttl_left(const nvc_hdr *h, int64_t now)
{
    return h->exptime == 0 ? -1 : h->exptime - now;
}

static bool is_noreply(const tok *t)
{
    return t->n == 7 && memcmp(t->s, "noreply", 7) == 0;
}

static bool tok_is(const tok *t, const char *s)
{
    size_t n = strlen(s);
    return t->n == n && memcmp(t->s, s, n) == 0;
}

/* ---- item helpers ------------------------------------------------------- */

/* Writes header + data into the worker's scratch buffer and stores it. */
static int put_item(nvc_conn *c, const char *key, size_t klen, const nvc_hdr *h,
                    const char *a, size_t alen, const char *b, size_t blen, bool keep_cas,
                    uint64_t *cas)
{
    size_t vlen = sizeof *h + alen + blen;
    char *buf = nvc_scratch(c->w, vlen);
    if (!buf)
        return NVC_NOMEM;
    memcpy(buf, h, sizeof *h);
    if (alen)
        memmove(buf + sizeof *h, a, alen);
    if (blen)
        memmove(buf + sizeof *h + alen, b, blen);
    return nvc_store_put(nvc_srv.store, key, klen, buf, vlen, keep_cas, cas);
}

static void reply_put_error(nvc_conn *c, int rc)
{
    if (rc == NVC_NOMEM) {
        NVC_COUNT(&c->w->cnt, store_no_memory, 1);
        OUTS(c, "SERVER_ERROR out of memory storing object\r\n");
    } else if (rc == NVC_TOOLARGE) {
        NVC_COUNT(&c->w->cnt, store_too_large, 1);
        OUTS(c, "SERVER_ERROR object too large for cache\r\n");
    } else {
        OUTS(c, "SERVER_ERROR storage error\r\n");
    }
}

/* Decimal digits of x at p; returns the end. */
static char *put_u64(char *p, uint64_t x)
{
    char tmp[20];
    int n = 0;
    do
        tmp[n++] = (char)('0' + x % 10);
    while ((x /= 10) != 0);
    while (n)
        *p++ = tmp[--n];
    return p;
}

/* Values at least this long are sent from their place in the pool (an
 * iovec of the reply's writev) instead of copied into the output: below
 * it, the copy costs less than the extra buffer chain. */
#define NVC_REF_MIN 1024u

/* VALUE key flags bytes [cas]\r\n data\r\n. by_ref: v->data is the item in
 * the pool, read in a lookup of this thread's read section, which main.c
 * holds until the reply is written or copied (nvc_conn_read_section). */
static void value_line(nvc_conn *c, const char *key, size_t klen, const nvc_view *v, bool cas,
                       bool by_ref)
{
    char buf[NVC_KEY_MAX + 96];
    char *p = buf;
    memcpy(p, "VALUE ", 6);
    memcpy(p + 6, key, klen);
    p += 6 + klen;
    *p++ = ' ';
    p = put_u64(p, v->hdr.flags);
    *p++ = ' ';
    p = put_u64(p, v->len);
    if (cas) {
        *p++ = ' ';
        p = put_u64(p, v->hdr.cas);
    }
    *p++ = '\r';
    *p++ = '\n';
    if (by_ref && v->len >= NVC_REF_MIN) {
        out(c, buf, (size_t)(p - buf));
        nvc_conn_read_section(c);
        if (nvc_out_ref(c, v->data, v->len)) {
            OUTS(c, "\r\n");
            return;
        }
        out(c, v->data, v->len);
        OUTS(c, "\r\n");
        return;
    }
    if (v->len <= sizeof buf - (size_t)(p - buf) - 2) {
        /* small: one append for the whole reply */
        memcpy(p, v->data, v->len);
        p += v->len;
        *p++ = '\r';
        *p++ = '\n';
        out(c, buf, (size_t)(p - buf));
        return;
    }
    out(c, buf, (size_t)(p - buf));
    out(c, v->data, v->len);
    OUTS(c, "\r\n");
}

/* ---- retrieval ---------------------------------------------------------- */

struct get_line {
    nvc_conn *c;
    const char *key;
    size_t klen;
    bool cas;
};

static void get_line_fn(const nvc_view *v, void *arg)
{
    struct get_line *g = arg;
    value_line(g->c, g->key, g->klen, v, g->cas, true);
}

/* get/gets key*, gat/gats exptime key*. */
static void cmd_get(nvc_conn *c, tok *t, int nt, bool cas, bool touch, bool end)
{
    int first = touch ? 2 : 1;
    int64_t now = time(NULL), exptime = 0;
    if (nt <= first) {
        OUTS(c, "ERROR\r\n");
        return;
    }
    if (touch) {
        if (!parse_i32(&t[1], &exptime)) {
            OUTS(c, "CLIENT_ERROR invalid exptime argument\r\n");
            return;
        }
        exptime = abs_time(exptime, now);
    }
    nvc_counters *k = &c->w->cnt;
    for (int i = first; i < nt; i++) {
        if (t[i].n > NVC_KEY_MAX) {
            OUTS(c, "CLIENT_ERROR bad command line format\r\n");
            return;
        }
        nvc_view v;
        int hit;
        if (!touch) {
            /* A plain get takes no store lock: the value is copied into
             * the output while the map keeps it from being reused. */
            struct get_line g = { c, t[i].s, t[i].n, cas };
            hit = nvc_store_read(nvc_srv.store, t[i].s, t[i].n, now, true, get_line_fn, &g);
            goto counted;
        }
        nvc_store_lock(nvc_srv.store, t[i].s, t[i].n);
        hit = nvc_store_find(nvc_srv.store, t[i].s, t[i].n, now, true, &v);
        if (hit && touch) {
            nvc_hdr h = v.hdr;
            h.exptime = exptime;
            if (put_item(c, t[i].s, t[i].n, &h, v.data, v.len, NULL, 0, true, NULL) == NVC_OK) {
                v.hdr = h;
                v.data = c->w->scratch + sizeof h;
            } else {
                hit = 0;
            }
        }
        if (hit)
            value_line(c, t[i].s, t[i].n, &v, cas, false);
        nvc_store_unlock(nvc_srv.store, t[i].s, t[i].n);
    counted:
        if (touch) {
            NVC_COUNT(k, cmd_touch, 1);
            if (hit)
                NVC_COUNT(k, touch_hits, 1);
            else
                NVC_COUNT(k, touch_misses, 1);
        }
        NVC_COUNT(k, cmd_get, 1);
        if (hit)
            NVC_COUNT(k, get_hits, 1);
        else
            NVC_COUNT(k, get_misses, 1);
    }
    if (end)
        OUTS(c, "END\r\n");
}

/* ---- storage ------------------------------------------------------------ */

static void cmd_update(nvc_conn *c, tok *t, int nt, int cmd)
{
    int base = cmd == CMD_CAS ? 6 : 5;
    if (nt != base && nt != base + 1) {
        OUTS(c, "ERROR\r\n");
        return;
    }
    nvc_pending *p = &c->p;
    memset(p, 0, sizeof *p);
    p->noreply = nt == base + 1 && is_noreply(&t[base]);
    int64_t exptime, bytes;
    uint64_t flags;
    /* Flags wider than 32 bits are truncated, as memcached 1.6 does. */
    if (t[1].n > NVC_KEY_MAX || !parse_u64(&t[2], &flags) || !parse_i32(&t[3], &exptime) ||
        !parse_i32(&t[4], &bytes) || bytes < 0 ||
        (cmd == CMD_CAS && !parse_u64(&t[5], &p->cas))) {
        OUTS(c, "CLIENT_ERROR bad command line format\r\n");
        return;
    }
    p->flags = (uint32_t)flags;
    p->cmd = cmd;
    p->klen = (uint8_t)t[1].n;
    memcpy(p->key, t[1].s, t[1].n);
    p->exptime = abs_time(exptime, time(NULL));
    p->bytes = (size_t)bytes;
    if (p->bytes > nvc_srv.set.item_max) {
        NVC_COUNT(&c->w->cnt, store_too_large, 1);
        if (!p->noreply)
            OUTS(c, "SERVER_ERROR object too large for cache\r\n");
        /* As memcached: a failed set must not leave the old value behind. */
        if (cmd == CMD_SET) {
            nvc_store_lock(nvc_srv.store, p->key, p->klen);
            nvc_store_delete(nvc_srv.store, p->key, p->klen);
            nvc_store_unlock(nvc_srv.store, p->key, p->klen);
        }
        c->swallow = p->bytes + 2;
        c->state = CONN_SWALLOW;
        return;
    }
    c->state = CONN_DATA;
}

/* Meta set's reply flags, in the order given (O, k, c, b). */
static void meta_ret(nvc_conn *c, const char *flags, size_t flen, const char *key, size_t klen,
                     uint64_t cas, const nvc_hdr *h, size_t vlen, int64_t now);

static void complete_update(nvc_conn *c, const char *data)
{
    nvc_pending *p = &c->p;
    nvc_store *s = nvc_srv.store;
    int64_t now = time(NULL);
    nvc_view v;
    const char *reply = NULL;   /* text protocol reply */
    const char *mcode = NULL;   /* meta reply code */
    uint64_t cas = 0;
    int rc = NVC_OK;
    NVC_COUNT(&c->w->cnt, cmd_set, 1);
    nvc_store_lock(s, p->key, p->klen);
    nvc_hdr h = { .flags = p->flags, .exptime = p->exptime, .time = now };
    bool cas_given = p->cmd == CMD_CAS || (p->meta && p->cas != 0);
    /* A plain set stores whatever was there: no lookup of the old item. */
    bool hit = (p->cmd != CMD_SET || cas_given) &&
               nvc_store_find(s, p->key, p->klen, now, false, &v);
    if (cas_given && !hit) {
        reply = "NOT_FOUND\r\n", mcode = "NF";
        NVC_COUNT(&c->w->cnt, cas_misses, 1);
    } else if (cas_given && v.hdr.cas != p->cas) {
        reply = "EXISTS\r\n", mcode = "EX";
        NVC_COUNT(&c->w->cnt, cas_badval, 1);
    } else if ((p->cmd == CMD_ADD && hit) ||
               ((p->cmd == CMD_REPLACE || p->cmd == CMD_APPEND || p->cmd == CMD_PREPEND) && !hit)) {
        reply = "NOT_STORED\r\n", mcode = "NS";
        if (hit)
            nvc_store_find(s, p->key, p->klen, now, true, &v);  /* add bumps, as memcached */
    } else {
        if (cas_given)
            NVC_COUNT(&c->w->cnt, cas_hits, 1);
        if (p->cmd == CMD_APPEND || p->cmd == CMD_PREPEND) {
            h = v.hdr;
            h.time = now;
            /* The new data sits in the scratch buffer put_item fills. */
            char *copy = v.len + p->bytes > nvc_srv.set.item_max ? NULL : malloc(p->bytes + 1);
            if (!copy) {
                rc = NVC_NOMEM;
            } else {
                memcpy(copy, data, p->bytes);
                if (p->cmd == CMD_APPEND)
                    rc = put_item(c, p->key, p->klen, &h, v.data, v.len, copy, p->bytes, false, &cas);
                else
                    rc = put_item(c, p->key, p->klen, &h, copy, p->bytes, v.data, v.len, false, &cas);
                free(copy);
            }
        } else {
            rc = put_item(c, p->key, p->klen, &h, data, p->bytes, NULL, 0, false, &cas);
        }
        reply = "STORED\r\n", mcode = "HD";
    }
    nvc_store_unlock(s, p->key, p->klen);
    if (rc != NVC_OK) {
        if (!p->noreply || p->meta)
            reply_put_error(c, rc);
        return;
    }
    if (!p->meta) {
        if (!p->noreply)
            out(c, reply, strlen(reply));
        return;
    }
    if (p->quiet && mcode[0] == 'H')
        return;
    out(c, mcode, 2);
    meta_ret(c, p->ret, p->retlen, p->key, p->klen, mcode[0] == 'H' ? cas : 0, NULL, 0, now);
    OUTS(c, "\r\n");
}

/* ---- other text commands ------------------------------------------------ */

static void cmd_delete(nvc_conn *c, tok *t, int nt)
{
    if (nt < 2 || nt > 4) {
        OUTS(c, "ERROR\r\n");
        return;
    }
    bool noreply = is_noreply(&t[nt - 1]);
    if (nt > 2) {
        bool zero = tok_is(&t[2], "0");
        if (!((nt == 3 && (zero || noreply)) || (nt == 4 && zero && noreply))) {
            OUTS(c, "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n");
            return;
        }
    }
    if (t[1].n > NVC_KEY_MAX) {
        OUTS(c, "CLIENT_ERROR bad command line format\r\n");
        return;
    }
    nvc_view v;
    nvc_store_lock(nvc_srv.store, t[1].s, t[1].n);
    int hit = nvc_store_find(nvc_srv.store, t[1].s, t[1].n, time(NULL), false, &v);
    /* An expired or flushed item is a miss, but its space is reclaimed. */
    int gone = nvc_store_delete(nvc_srv.store, t[1].s, t[1].n);
    nvc_store_unlock(nvc_srv.store, t[1].s, t[1].n);
    hit = hit && gone;
    if (hit)
        NVC_COUNT(&c->w->cnt, delete_hits, 1);
    else
        NVC_COUNT(&c->w->cnt, delete_misses, 1);
    if (!noreply) {
        if (hit)
            OUTS(c, "DELETED\r\n");
        else
            OUTS(c, "NOT_FOUND\r\n");
    }
}

/* The number an item holds: digits, optionally followed by spaces (what an
 * in-place decr leaves, see do_arith). */
static bool item_number(const nvc_view *v, uint64_t *x)
{
    size_t n = 0;
    while (n < v->len && isdigit((unsigned char)v->data[n]))
        n++;
    for (size_t i = n; i < v->len; i++)
        if (v->data[i] != ' ' && v->data[i] != '\r' && v->data[i] != '\n')
            return false;
    tok t = { (char *)v->data, n };
    return parse_u64(&t, x);
}

enum { ARITH_OK, ARITH_MISS, ARITH_NONNUM, ARITH_EXISTS, ARITH_ERR };

/* incr/decr under the lock. As memcached, a shorter result keeps the item's
 * length, padded with spaces ("10" decr 1 -> "9 "). */
static int do_arith(nvc_conn *c, const char *key, size_t klen, bool incr, uint64_t delta,
                    uint64_t cas_in, int64_t *new_exptime, uint64_t *result, uint64_t *cas,
                    nvc_hdr *hout, int *putrc)
{
    nvc_view v;
    int64_t now = time(NULL);
    if (!nvc_store_find(nvc_srv.store, key, klen, now, true, &v))
        return ARITH_MISS;
    if (cas_in && v.hdr.cas != cas_in)
        return ARITH_EXISTS;
    uint64_t x;
    if (!item_number(&v, &x))
        return ARITH_NONNUM;
    if (incr)
        x += delta;
    else
        x = delta > x ? 0 : x - delta;
    char num[24];
    int n = snprintf(num, sizeof num, "%" PRIu64, x);
    char buf[64];
    size_t len = (size_t)n;
    memcpy(buf, num, len);
    if (len < v.len && v.len <= sizeof buf) {
        memset(buf + len, ' ', v.len - len);
        len = v.len;
    }
    nvc_hdr h = v.hdr;
    h.time = now;
    if (new_exptime)
        h.exptime = *new_exptime;
    *putrc = put_item(c, key, klen, &h, buf, len, NULL, 0, false, cas);
    if (*putrc != NVC_OK)
        return ARITH_ERR;
    *result = x;
    h.cas = *cas;
    if (hout)
        *hout = h;
    return ARITH_OK;
}

static void cmd_arith(nvc_conn *c, tok *t, int nt, bool incr)
{
    if (nt != 3 && nt != 4) {
        OUTS(c, "ERROR\r\n");
        return;
    }
    bool noreply = nt == 4 && is_noreply(&t[3]);
    uint64_t delta, result, cas;
    if (t[1].n > NVC_KEY_MAX) {
        OUTS(c, "CLIENT_ERROR bad command line format\r\n");
        return;
    }
    if (!parse_u64(&t[2], &delta)) {
        OUTS(c, "CLIENT_ERROR invalid numeric delta argument\r\n");
        return;
    }
    int putrc = NVC_OK;
    nvc_store_lock(nvc_srv.store, t[1].s, t[1].n);
    int rc = do_arith(c, t[1].s, t[1].n, incr, delta, 0, NULL, &result, &cas, NULL, &putrc);
    nvc_store_unlock(nvc_srv.store, t[1].s, t[1].n);
    nvc_counters *k = &c->w->cnt;
    if (rc == ARITH_MISS) {
        if (incr)
            NVC_COUNT(k, incr_misses, 1);
        else
            NVC_COUNT(k, decr_misses, 1);
    } else if (incr) {
        NVC_COUNT(k, incr_hits, 1);
    } else {
        NVC_COUNT(k, decr_hits, 1);
    }
    if (rc == ARITH_NONNUM) {
        OUTS(c, "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
        return;
    }
    if (rc == ARITH_ERR) {
        reply_put_error(c, putrc);
        return;
    }
    if (noreply)
        return;
    if (rc == ARITH_MISS)
        OUTS(c, "NOT_FOUND\r\n");
    else
        outf(c, "%" PRIu64 "\r\n", result);
}

static void cmd_touch(nvc_conn *c, tok *t, int nt)
{
    if (nt != 3 && nt != 4) {
        OUTS(c, "ERROR\r\n");
        return;
    }
    bool noreply = nt == 4 && is_noreply(&t[3]);
    int64_t exptime, now = time(NULL);
    if (t[1].n > NVC_KEY_MAX) {
        OUTS(c, "CLIENT_ERROR bad command line format\r\n");
        return;
    }
    if (!parse_i32(&t[2], &exptime)) {
        OUTS(c, "CLIENT_ERROR invalid exptime argument\r\n");
        return;
    }
    nvc_view v;
    int rc = NVC_OK;
    nvc_store_lock(nvc_srv.store, t[1].s, t[1].n);
    int hit = nvc_store_find(nvc_srv.store, t[1].s, t[1].n, now, true, &v);
    if (hit) {
        nvc_hdr h = v.hdr;
        h.exptime = abs_time(exptime, now);
        rc = put_item(c, t[1].s, t[1].n, &h, v.data, v.len, NULL, 0, true, NULL);
    }
    nvc_store_unlock(nvc_srv.store, t[1].s, t[1].n);
    NVC_COUNT(&c->w->cnt, cmd_touch, 1);
    if (hit)
        NVC_COUNT(&c->w->cnt, touch_hits, 1);
    else
        NVC_COUNT(&c->w->cnt, touch_misses, 1);
    if (rc != NVC_OK) {
        reply_put_error(c, rc);
        return;
    }
    if (!noreply) {
        if (hit)
            OUTS(c, "TOUCHED\r\n");
        else
            OUTS(c, "NOT_FOUND\r\n");
    }
}

static void cmd_flush(nvc_conn *c, tok *t, int nt)
{
    if (nt > 3) {
        OUTS(c, "ERROR\r\n");
        return;
    }
    bool noreply = nt > 1 && is_noreply(&t[nt - 1]);
    int64_t delay = 0, now = time(NULL);
    if (nt == 3 || (nt == 2 && !noreply)) {
        if (!parse_i32(&t[1], &delay)) {
            OUTS(c, "CLIENT_ERROR invalid exptime argument\r\n");
            return;
        }
    }
    int64_t when = delay > 0 ? abs_time(delay, now) : now;
    nvc_store_flush(nvc_srv.store, now, when);
    NVC_COUNT(&c->w->cnt, cmd_flush, 1);
    if (!noreply)
        OUTS(c, "OK\r\n");
}

static void cmd_stats(nvc_conn *c, tok *t, int nt)
{
    nvc_store_stats st;
    nvc_counters k;
    int64_t now = time(NULL);
    const nvc_settings *set = &nvc_srv.set;
    if (nt == 1) {
        nvc_store_stats_get(nvc_srv.store, &st);
        nvc_counters_sum(&k);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        uint64_t ops = k.cmd_set + k.delete_hits + k.incr_hits + k.decr_hits + k.touch_hits;
        outf(c, "STAT pid %d\r\n", (int)getpid());
        outf(c, "STAT uptime %" PRId64 "\r\n", now - nvc_srv.started);
        outf(c, "STAT time %" PRId64 "\r\n", now);
        outf(c, "STAT version 1.6.18-nvcached-%s\r\n", NVC_VERSION);
        outf(c, "STAT libevent %s\r\n", "2.1");
        outf(c, "STAT pointer_size %d\r\n", (int)(8 * sizeof(void *)));
        outf(c, "STAT rusage_user %ld.%06ld\r\n", (long)ru.ru_utime.tv_sec, (long)ru.ru_utime.tv_usec);
        outf(c, "STAT rusage_system %ld.%06ld\r\n", (long)ru.ru_stime.tv_sec, (long)ru.ru_stime.tv_usec);
        outf(c, "STAT max_connections %d\r\n", set->maxconns);
        outf(c, "STAT curr_connections %" PRIu64 "\r\n", __atomic_load_n(&nvc_srv.curr_conns, __ATOMIC_RELAXED));
        outf(c, "STAT total_connections %" PRIu64 "\r\n", __atomic_load_n(&nvc_srv.total_conns, __ATOMIC_RELAXED));
        outf(c, "STAT rejected_connections %" PRIu64 "\r\n", __atomic_load_n(&nvc_srv.rejected_conns, __ATOMIC_RELAXED));
        outf(c, "STAT cmd_get %" PRIu64 "\r\n", k.cmd_get);
        outf(c, "STAT cmd_set %" PRIu64 "\r\n", k.cmd_set);
        outf(c, "STAT cmd_flush %" PRIu64 "\r\n", k.cmd_flush);
        outf(c, "STAT cmd_touch %" PRIu64 "\r\n", k.cmd_touch);
        outf(c, "STAT cmd_meta %" PRIu64 "\r\n", k.cmd_meta);
        outf(c, "STAT get_hits %" PRIu64 "\r\n", k.get_hits);
        outf(c, "STAT get_misses %" PRIu64 "\r\n", k.get_misses);
        outf(c, "STAT get_expired %" PRIu64 "\r\n", k.get_expired);
        outf(c, "STAT get_flushed %" PRIu64 "\r\n", k.get_flushed);
        outf(c, "STAT delete_misses %" PRIu64 "\r\n", k.delete_misses);
        outf(c, "STAT delete_hits %" PRIu64 "\r\n", k.delete_hits);
        outf(c, "STAT incr_misses %" PRIu64 "\r\n", k.incr_misses);
        outf(c, "STAT incr_hits %" PRIu64 "\r\n", k.incr_hits);
        outf(c, "STAT decr_misses %" PRIu64 "\r\n", k.decr_misses);
        outf(c, "STAT decr_hits %" PRIu64 "\r\n", k.decr_hits);
        outf(c, "STAT cas_misses %" PRIu64 "\r\n", k.cas_misses);
        outf(c, "STAT cas_hits %" PRIu64 "\r\n", k.cas_hits);
        outf(c, "STAT cas_badval %" PRIu64 "\r\n", k.cas_badval);
        outf(c, "STAT touch_hits %" PRIu64 "\r\n", k.touch_hits);
        outf(c, "STAT touch_misses %" PRIu64 "\r\n", k.touch_misses);
        outf(c, "STAT store_too_large %" PRIu64 "\r\n", k.store_too_large);
        outf(c, "STAT store_no_memory %" PRIu64 "\r\n", k.store_no_memory);
        outf(c, "STAT bytes_read %" PRIu64 "\r\n", k.bytes_read);
        outf(c, "STAT bytes_written %" PRIu64 "\r\n", k.bytes_written);
        outf(c, "STAT limit_maxbytes %" PRIu64 "\r\n", st.limit_bytes);
        outf(c, "STAT threads %d\r\n", set->threads);
        outf(c, "STAT bytes %" PRIu64 "\r\n", st.bytes);
        outf(c, "STAT curr_items %" PRIu64 "\r\n", st.curr_items);
        outf(c, "STAT total_items %" PRIu64 "\r\n", st.total_items);
        outf(c, "STAT evictions %" PRIu64 "\r\n", st.evictions);
        outf(c, "STAT reclaimed %" PRIu64 "\r\n", st.reclaimed);
        /* nvheap's own */
        outf(c, "STAT nvheap_pool %s\r\n", st.path);
        outf(c, "STAT nvheap_domain %s\r\n", st.domain ? st.domain : "?");
        outf(c, "STAT nvheap_pool_bytes %" PRIu64 "\r\n", st.pool_size);
        outf(c, "STAT nvheap_epoch %" PRIu64 "\r\n", st.epoch);
        outf(c, "STAT generation %" PRIu64 "\r\n", st.generation);
        outf(c, "STAT nvheap_recovery_us %" PRIu64 "\r\n", st.recovery_us);
        outf(c, "STAT nvheap_index_rebuilt %d\r\n", st.scan_done ? 1 : 0);
        outf(c, "STAT nvheap_index_rebuild_us %" PRIu64 "\r\n", st.scan_us);
        outf(c, "STAT nvheap_index_walk_us %" PRIu64 "\r\n", st.walk_us);
        outf(c, "STAT nvheap_lines_flushed %" PRIu64 "\r\n", st.lines_flushed);
        outf(c, "STAT nvheap_fences %" PRIu64 "\r\n", st.fences);
        outf(c, "STAT nvheap_changes %" PRIu64 "\r\n", ops);
        outf(c, "STAT nvheap_fences_per_change %.3f\r\n", ops ? (double)st.fences / (double)ops : 0.0);
        outf(c, "STAT nvheap_lines_per_change %.3f\r\n", ops ? (double)st.lines_flushed / (double)ops : 0.0);
        OUTS(c, "STAT worker_conns ");
        for (int i = 0; i < set->threads; i++)
            outf(c, i ? ",%" PRIu64 : "%" PRIu64,
                 __atomic_load_n(&nvc_srv.workers[i].nconns, __ATOMIC_RELAXED));
        OUTS(c, "\r\nEND\r\n");
    } else if (nt == 2 && tok_is(&t[1], "settings")) {
        outf(c, "STAT maxbytes %" PRIu64 "\r\n", set->maxbytes);
        outf(c, "STAT maxconns %d\r\n", set->maxconns);
        outf(c, "STAT tcpport %d\r\n", set->port);
        outf(c, "STAT udpport 0\r\n");
        outf(c, "STAT inter %s\r\n", set->addr);
        outf(c, "STAT verbosity %d\r\n", __atomic_load_n(&nvc_srv.verbose, __ATOMIC_RELAXED));
        outf(c, "STAT evictions %s\r\n", set->no_evict ? "off" : "on");
        outf(c, "STAT num_threads %d\r\n", set->threads);
        outf(c, "STAT cas_enabled yes\r\n");
        outf(c, "STAT item_size_max %zu\r\n", set->item_max);
        outf(c, "STAT binding_protocol ascii\r\n");
        outf(c, "STAT nvheap_pool %s\r\n", set->pool);
        OUTS(c, "END\r\n");
    } else if (nt == 2 && (tok_is(&t[1], "items") || tok_is(&t[1], "slabs"))) {
        /* One class: the pool has no slab classes of memcached's kind. */
        nvc_store_stats_get(nvc_srv.store, &st);
        if (tok_is(&t[1], "items")) {
            if (st.curr_items) {
                outf(c, "STAT items:1:number %" PRIu64 "\r\n", st.curr_items);
                outf(c, "STAT items:1:evicted %" PRIu64 "\r\n", st.evictions);
                outf(c, "STAT items:1:reclaimed %" PRIu64 "\r\n", st.reclaimed);
            }
        } else {
            if (st.curr_items) {
                outf(c, "STAT 1:used_chunks %" PRIu64 "\r\n", st.curr_items);
                outf(c, "STAT 1:mem_requested %" PRIu64 "\r\n", st.bytes);
            }
            outf(c, "STAT active_slabs %d\r\n", st.curr_items ? 1 : 0);
            outf(c, "STAT total_malloced %" PRIu64 "\r\n", st.bytes);
        }
        OUTS(c, "END\r\n");
    } else if (nt == 2 && tok_is(&t[1], "reset")) {
        for (int i = 0; i < set->threads; i++) {
            uint64_t *p = (uint64_t *)&nvc_srv.workers[i].cnt;
            for (size_t j = 0; j < sizeof(nvc_counters) / sizeof(uint64_t); j++)
                __atomic_store_n(&p[j], 0, __ATOMIC_RELAXED);
        }
        nvc_store_stats_reset(nvc_srv.store);
        OUTS(c, "RESET\r\n");
    } else {
        OUTS(c, "ERROR\r\n");
    }
}

/* ---- meta commands ------------------------------------------------------ */

/* Flags of one meta command: which were given and their tokens. */
typedef struct mflags {
    uint64_t seen[2];          /* bit per ASCII flag char */
    tok arg[128];
} mflags;

static bool mf_has(const mflags *f, char ch)
{
    unsigned u = (unsigned char)ch;
    return u < 128 && (f->seen[u >> 6] >> (u & 63)) & 1;
}

/* Parses t[first..nt) as flags: `valid` are the flags of the command,
 * `supported` those nvcached implements. Writes a CLIENT_ERROR and returns
 * false on a bad one. */
static bool mf_parse(nvc_conn *c, tok *t, int first, int nt, const char *valid,
                     const char *supported, mflags *f)
{
    memset(f->seen, 0, sizeof f->seen);
    for (int i = first; i < nt; i++) {
        unsigned ch = (unsigned char)t[i].s[0];
        if (ch >= 128 || !strchr(valid, (int)ch)) {
            OUTS(c, "CLIENT_ERROR invalid flag\r\n");
            return false;
        }
        if (mf_has(f, (char)ch)) {
            OUTS(c, "CLIENT_ERROR duplicate flag\r\n");
            return false;
        }
        if (!strchr(supported, (int)ch)) {
            outf(c, "CLIENT_ERROR unsupported flag %c\r\n", (char)ch);
            return false;
        }
        f->seen[ch >> 6] |= 1ull << (ch & 63);
        f->arg[ch] = (tok){ t[i].s + 1, t[i].n - 1 };
        if (ch == 'O' && t[i].n - 1 > 32) {
            OUTS(c, "CLIENT_ERROR opaque token too long\r\n");
            return false;
        }
    }
    return true;
}

/* Appends the return flags asked for in `flags` (the command's flag tokens,
 * space separated, in the client's order). h may be NULL (meta set). */
static void meta_ret(nvc_conn *c, const char *flags, size_t flen, const char *key, size_t klen,
                     uint64_t cas, const nvc_hdr *h, size_t vlen, int64_t now)
{
    size_t i = 0;
    while (i < flen) {
        while (i < flen && flags[i] == ' ')
            i++;
        if (i >= flen)
            break;
        size_t j = i;
        while (j < flen && flags[j] != ' ')
            j++;
        char ch = flags[i];
        switch (ch) {
        case 'O':
            OUTS(c, " ");
            out(c, flags + i, j - i);
            break;
        case 'k':
            OUTS(c, " k");
            out(c, key, klen);
            break;
        case 'c':
            outf(c, " c%" PRIu64, cas);
            break;
        case 'f':
            if (h)
                outf(c, " f%" PRIu32, h->flags);
            break;
        case 's':
            if (h)
                outf(c, " s%zu", vlen);
            break;
        case 't':
            if (h)
                outf(c, " t%" PRId64, ttl_left(h, now));
            break;
        default:
            break;
        }
        i = j;
    }
}

/* The flags part of the line (after the key) as one string, for meta_ret. */
static void flags_span(tok *t, int first, int nt, const char **s, size_t *n)
{
    if (first >= nt) {
        *s = "";
        *n = 0;
        return;
    }
    *s = t[first].s;
    *n = (size_t)(t[nt - 1].s + t[nt - 1].n - t[first].s);
}

static bool meta_key(nvc_conn *c, tok *t, int nt)
{
    if (nt < 2) {
        OUTS(c, "CLIENT_ERROR bad command line format\r\n");
        return false;
    }
    if (t[1].n > NVC_KEY_MAX) {
        OUTS(c, "CLIENT_ERROR bad command line format\r\n");
        return false;
    }
    return true;
}

/* The start every meta command with a key shares: "ERROR" without a key,
 * then the key's length, then its flags (`allowed`; those in `with_arg`
 * take a token). false: the reply is written, the command is over. */
static bool meta_start(nvc_conn *c, tok *t, int nt, const char *allowed, const char *with_arg,
                       mflags *f)
{
    if (nt < 2) {
        OUTS(c, "ERROR\r\n");
        return false;
    }
    return meta_key(c, t, nt) && mf_parse(c, t, 2, nt, allowed, with_arg, f);
}

#define HF_WON 1u   /* nvc_hdr.reserved: a vivified item whose win token is out */

static void cmd_mg(nvc_conn *c, tok *t, int nt)
{
    mflags f;
    if (!meta_start(c, t, nt, "bcfhklOqstuvNRTE", "cfkOqstuvNT", &f)) return;
    int64_t now = time(NULL), ttl;
    if (mf_has(&f, 'T') && !parse_i32(&f.arg['T'], &ttl)) {
        OUTS(c, "CLIENT_ERROR bad token in command line format\r\n");
        return;
    }
    int64_t vttl = 0;
    if (mf_has(&f, 'N') && !parse_i32(&f.arg['N'], &vttl)) {
        OUTS(c, "CLIENT_ERROR bad token in command line format\r\n");
        return;
    }
    const char *key = t[1].s;
    size_t klen = t[1].n;
    nvc_view v;
    const char *win = "";
    int rc = NVC_OK;
    nvc_store *s = nvc_srv.store;
    nvc_store_lock(s, key, klen);
    int hit = nvc_store_find(s, key, klen, now, !mf_has(&f, 'u'), &v);
    if (!hit && mf_has(&f, 'N')) {
        /* Vivify: an empty item that tells this client it won the recache. */
        nvc_hdr h = { .exptime = abs_time(vttl, now), .time = now, .reserved = HF_WON };
        rc = put_item(c, key, klen, &h, NULL, 0, NULL, 0, false, &h.cas);
        if (rc == NVC_OK) {
            hit = 1;
            v.hdr = h;
            v.data = "";
            v.len = 0;
            win = " W";
        }
    } else if (hit && (v.hdr.reserved & HF_WON)) {
        win = " Z";
    }
    if (hit && mf_has(&f, 'T')) {
        nvc_hdr h = v.hdr;
        h.exptime = abs_time(ttl, now);
        rc = put_item(c, key, klen, &h, v.data, v.len, NULL, 0, true, NULL);
        if (rc == NVC_OK) {
            v.hdr = h;
            v.data = c->w->scratch + sizeof h;
        }
    }
    NVC_COUNT(&c->w->cnt, cmd_meta, 1);
    NVC_COUNT(&c->w->cnt, cmd_get, 1);
    if (hit)
        NVC_COUNT(&c->w->cnt, get_hits, 1);
    else
        NVC_COUNT(&c->w->cnt, get_misses, 1);
    if (rc != NVC_OK) {
        nvc_store_unlock(s, key, klen);
        reply_put_error(c, rc);
        return;
    }
    if (!hit) {
        nvc_store_unlock(s, key, klen);
        if (!mf_has(&f, 'q'))
            OUTS(c, "EN\r\n");
        return;
    }
    const char *fs;
    size_t fn;
    flags_span(t, 2, nt, &fs, &fn);
    if (mf_has(&f, 'v'))
        outf(c, "VA %zu", v.len);
    else
        OUTS(c, "HD");
    meta_ret(c, fs, fn, key, klen, v.hdr.cas, &v.hdr, v.len, now);
    out(c, win, strlen(win));
    OUTS(c, "\r\n");
    if (mf_has(&f, 'v')) {
        out(c, v.data, v.len);
        OUTS(c, "\r\n");
    }
    nvc_store_unlock(s, key, klen);
}

static void cmd_ms(nvc_conn *c, tok *t, int nt)
{
    mflags f;
    if (nt < 3) {
        OUTS(c, "CLIENT_ERROR bad command line format\r\n");
        return;
    }
    int64_t bytes;
    if (!meta_key(c, t, nt))
        return;
    if (!parse_i32(&t[2], &bytes) || bytes < 0) {
        OUTS(c, "CLIENT_ERROR bad command line format\r\n");
        return;
    }
    /* From here on an error swallows the data block, as memcached does. */
    if (!mf_parse(c, t, 3, nt, "bcCEFIkOqsSTM", "cCFkOqTM", &f))
        goto swallow;
    nvc_pending *p = &c->p;
    memset(p, 0, sizeof *p);
    p->meta = true;
    p->cmd = CMD_SET;
    int64_t ttl = 0;
    if ((mf_has(&f, 'F') && !parse_u32(&f.arg['F'], &p->flags)) ||
        (mf_has(&f, 'C') && !parse_u64(&f.arg['C'], &p->cas)) ||
        (mf_has(&f, 'T') && !parse_i32(&f.arg['T'], &ttl))) {
        OUTS(c, "CLIENT_ERROR bad token in command line format\r\n");
        goto swallow;
    }
    if (mf_has(&f, 'M')) {
        tok *m = &f.arg['M'];
        char mode = m->n == 1 ? m->s[0] : '?';
        switch (mode) {
        case 'E': case 'e': p->cmd = CMD_ADD; break;
        case 'A': case 'a': p->cmd = CMD_APPEND; break;
        case 'P': case 'p': p->cmd = CMD_PREPEND; break;
        case 'R': case 'r': p->cmd = CMD_REPLACE; break;
        case 'S': case 's': p->cmd = CMD_SET; break;
        default:
            OUTS(c, "CLIENT_ERROR invalid mode for ms M token\r\n");
            goto swallow;
        }
    }
    NVC_COUNT(&c->w->cnt, cmd_meta, 1);
    p->quiet = mf_has(&f, 'q');
    p->klen = (uint8_t)t[1].n;
    memcpy(p->key, t[1].s, t[1].n);
    p->exptime = abs_time(ttl, time(NULL));
    p->bytes = (size_t)bytes;
    /* Keep the return flags (O, k, c) for the reply after the data. */
    p->retlen = 0;
    for (int i = 3; i < nt; i++) {
        char ch = t[i].s[0];
        if ((ch == 'O' || ch == 'k' || ch == 'c') && p->retlen + t[i].n + 1 <= sizeof p->ret) {
            p->ret[p->retlen++] = ' ';
            memcpy(p->ret + p->retlen, t[i].s, t[i].n);
            p->retlen += t[i].n;
        }
    }
    if (p->bytes > nvc_srv.set.item_max) {
        NVC_COUNT(&c->w->cnt, store_too_large, 1);
        OUTS(c, "SERVER_ERROR object too large for cache\r\n");
        goto swallow;
    }
    c->state = CONN_DATA;
    return;
swallow:
    c->swallow = (size_t)bytes + 2;
    c->state = CONN_SWALLOW;
}

static void cmd_md(nvc_conn *c, tok *t, int nt)
{
    mflags f;
    if (!meta_start(c, t, nt, "bCEIkOqTx", "CkOq", &f)) return;
    uint64_t cas = 0;
    if (mf_has(&f, 'C') && !parse_u64(&f.arg['C'], &cas)) {
        OUTS(c, "CLIENT_ERROR bad token in command line format\r\n");
        return;
    }
    NVC_COUNT(&c->w->cnt, cmd_meta, 1);
    nvc_view v;
    const char *code;
    nvc_store_lock(nvc_srv.store, t[1].s, t[1].n);
    int hit = nvc_store_find(nvc_srv.store, t[1].s, t[1].n, time(NULL), false, &v);
    if (!hit) {
        nvc_store_delete(nvc_srv.store, t[1].s, t[1].n);   /* reclaim a dead one */
        code = "NF";
    } else if (cas && v.hdr.cas != cas) {
        code = "EX";
    } else {
        nvc_store_delete(nvc_srv.store, t[1].s, t[1].n);
        code = "HD";
    }
    nvc_store_unlock(nvc_srv.store, t[1].s, t[1].n);
    if (code[0] == 'H')
        NVC_COUNT(&c->w->cnt, delete_hits, 1);
    else
        NVC_COUNT(&c->w->cnt, delete_misses, 1);
    if (mf_has(&f, 'q') && code[0] == 'H')
        return;
    const char *fs;
    size_t fn;
    flags_span(t, 2, nt, &fs, &fn);
    out(c, code, 2);
    meta_ret(c, fs, fn, t[1].s, t[1].n, 0, NULL, 0, 0);
    OUTS(c, "\r\n");
}

static void cmd_ma(nvc_conn *c, tok *t, int nt)
{
    mflags f;
    if (!meta_start(c, t, nt, "bCENJDTMqtcvOk", "CNJDTMqtcvOk", &f)) return;
    uint64_t cas_in = 0, delta = 1, initial = 0;
    int64_t nttl = 0, ttl = 0, now = time(NULL);
    if ((mf_has(&f, 'C') && !parse_u64(&f.arg['C'], &cas_in)) ||
        (mf_has(&f, 'N') && !parse_i32(&f.arg['N'], &nttl)) ||
        (mf_has(&f, 'J') && !parse_u64(&f.arg['J'], &initial)) ||
        (mf_has(&f, 'D') && !parse_u64(&f.arg['D'], &delta)) ||
        (mf_has(&f, 'T') && !parse_i32(&f.arg['T'], &ttl))) {
        OUTS(c, "CLIENT_ERROR bad token in command line format\r\n");
        return;
    }
    bool incr = true;
    if (mf_has(&f, 'M')) {
        tok *m = &f.arg['M'];
        char mode = m->n == 1 ? m->s[0] : '?';
        if (mode == 'I' || mode == 'i' || mode == '+')
            incr = true;
        else if (mode == 'D' || mode == 'd' || mode == '-')
            incr = false;
        else {
            OUTS(c, "CLIENT_ERROR invalid mode for ma M token\r\n");
            return;
        }
    }
    NVC_COUNT(&c->w->cnt, cmd_meta, 1);
    int64_t newexp = abs_time(ttl, now);
    uint64_t result = 0, cas = 0;
    nvc_hdr h = { 0 };
    int putrc = NVC_OK;
    nvc_store_lock(nvc_srv.store, t[1].s, t[1].n);
    int rc = do_arith(c, t[1].s, t[1].n, incr, delta, cas_in,
                      mf_has(&f, 'T') ? &newexp : NULL, &result, &cas, &h, &putrc);
    if (rc == ARITH_MISS && mf_has(&f, 'N')) {
        char num[24];
        int n = snprintf(num, sizeof num, "%" PRIu64, initial);
        h = (nvc_hdr){ .exptime = abs_time(nttl, now), .time = now };
        putrc = put_item(c, t[1].s, t[1].n, &h, num, (size_t)n, NULL, 0, false, &cas);
        h.cas = cas;
        result = initial;
        rc = putrc == NVC_OK ? ARITH_OK : ARITH_ERR;
    }
    nvc_store_unlock(nvc_srv.store, t[1].s, t[1].n);
    switch (rc) {
    case ARITH_NONNUM:
        OUTS(c, "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
        return;
    case ARITH_ERR:
        reply_put_error(c, putrc);
        return;
    default:
        break;
    }
    const char *fs;
    size_t fn;
    flags_span(t, 2, nt, &fs, &fn);
    if (rc == ARITH_OK) {
        char num[24];
        int n = snprintf(num, sizeof num, "%" PRIu64, result);
        if (mf_has(&f, 'v'))
            outf(c, "VA %d", n);
        else if (mf_has(&f, 'q'))
            return;
        else
            OUTS(c, "HD");
        meta_ret(c, fs, fn, t[1].s, t[1].n, cas, &h, (size_t)n, now);
        OUTS(c, "\r\n");
        if (mf_has(&f, 'v')) {
            out(c, num, (size_t)n);
            OUTS(c, "\r\n");
        }
        return;
    }
    out(c, rc == ARITH_MISS ? "NF" : "EX", 2);
    meta_ret(c, fs, fn, t[1].s, t[1].n, 0, NULL, 0, now);
    OUTS(c, "\r\n");
}

static void cmd_me(nvc_conn *c, tok *t, int nt)
{
    if (nt < 2 || nt > 3) {
        OUTS(c, "ERROR\r\n");
        return;
    }
    if (nt == 3) {
        outf(c, "CLIENT_ERROR unsupported flag %c\r\n", t[2].s[0]);
        return;
    }
    if (!meta_key(c, t, nt))
        return;
    nvc_view v;
    int64_t now = time(NULL);
    nvc_store_lock(nvc_srv.store, t[1].s, t[1].n);
    int hit = nvc_store_find(nvc_srv.store, t[1].s, t[1].n, now, false, &v);
    nvc_store_unlock(nvc_srv.store, t[1].s, t[1].n);
    NVC_COUNT(&c->w->cnt, cmd_meta, 1);
    if (!hit) {
        OUTS(c, "EN\r\n");
        return;
    }
    OUTS(c, "ME ");
    out(c, t[1].s, t[1].n);
    outf(c, " exp=%" PRId64 " la=0 cas=%" PRIu64 " fetch=no cls=1 size=%zu\r\n",
         ttl_left(&v.hdr, now), v.hdr.cas, (32 + t[1].n + sizeof(nvc_hdr) + v.len + 63) & ~(size_t)63);
}

/* ---- dispatch ----------------------------------------------------------- */

/* Returns -1 to close the connection. */
static int dispatch(nvc_conn *c, char *line, size_t len)
{
    tok t[MAX_TOKENS];
    int nt = 0;
    size_t i = 0;
    while (i < len) {
        while (i < len && line[i] == ' ')
            i++;
        if (i >= len)
            break;
        const char *sp = memchr(line + i, ' ', len - i);   /* keys are long: not byte by byte */
        size_t j = sp ? (size_t)(sp - line) : len;
        if (nt == MAX_TOKENS) {
            /* Only get-style commands take that many tokens. */
            if (!(nt > 0 && (tok_is(&t[0], "get") || tok_is(&t[0], "gets") ||
                             tok_is(&t[0], "gat") || tok_is(&t[0], "gats")))) {
                OUTS(c, "ERROR\r\n");
                return 0;
            }
            /* Serve these keys, then go on with the rest of the line. */
            break;
        }
        t[nt++] = (tok){ line + i, j - i };
        i = j;
    }
    if (nt == 0) {
        OUTS(c, "ERROR\r\n");
        return 0;
    }
    tok *cmd = &t[0];
    if (tok_is(cmd, "get") || tok_is(cmd, "gets") || tok_is(cmd, "gat") || tok_is(cmd, "gats")) {
        bool cas = cmd->s[cmd->n - 1] == 's';
        bool touch = cmd->s[1] == 'a';
        /* A long multi-get is served in runs of MAX_TOKENS keys, one END. */
        int first = touch ? 2 : 1;
        for (;;) {
            while (i < len && line[i] == ' ')
                i++;
            bool last = i >= len;
            cmd_get(c, t, nt, cas, touch, last);
            if (last || nt <= first)
                break;
            nt = first;
            while (i < len && nt < MAX_TOKENS) {
                while (i < len && line[i] == ' ')
                    i++;
                if (i >= len)
                    break;
                const char *sp = memchr(line + i, ' ', len - i);
                size_t j = sp ? (size_t)(sp - line) : len;
                t[nt++] = (tok){ line + i, j - i };
                i = j;
            }
            if (nt == first) {
                OUTS(c, "END\r\n");
                break;
            }
        }
        return 0;
    }
    if (tok_is(cmd, "set")) cmd_update(c, t, nt, CMD_SET);
    else if (tok_is(cmd, "add")) cmd_update(c, t, nt, CMD_ADD);
    else if (tok_is(cmd, "replace")) cmd_update(c, t, nt, CMD_REPLACE);
    else if (tok_is(cmd, "append")) cmd_update(c, t, nt, CMD_APPEND);
    else if (tok_is(cmd, "prepend")) cmd_update(c, t, nt, CMD_PREPEND);
    else if (tok_is(cmd, "cas")) cmd_update(c, t, nt, CMD_CAS);
    else if (tok_is(cmd, "mg")) cmd_mg(c, t, nt);
    else if (tok_is(cmd, "ms")) cmd_ms(c, t, nt);
    else if (tok_is(cmd, "md")) cmd_md(c, t, nt);
    else if (tok_is(cmd, "ma")) cmd_ma(c, t, nt);
    else if (tok_is(cmd, "mn")) OUTS(c, "MN\r\n");
    else if (tok_is(cmd, "me")) cmd_me(c, t, nt);
    else if (tok_is(cmd, "delete")) cmd_delete(c, t, nt);
    else if (tok_is(cmd, "incr")) cmd_arith(c, t, nt, true);
    else if (tok_is(cmd, "decr")) cmd_arith(c, t, nt, false);
    else if (tok_is(cmd, "touch")) cmd_touch(c, t, nt);
    else if (tok_is(cmd, "flush_all")) cmd_flush(c, t, nt);
    else if (tok_is(cmd, "stats")) cmd_stats(c, t, nt);
    else if (tok_is(cmd, "version")) OUTS(c, NVC_VERSION_REPLY);   /* arguments ignored, as memcached */
    else if (tok_is(cmd, "quit") && nt == 1) return -1;
    else if (tok_is(cmd, "shutdown")) OUTS(c, "ERROR: shutdown not enabled\r\n");
    else if (tok_is(cmd, "verbosity") && (nt == 2 || nt == 3)) {
        int64_t lv;
        if (is_noreply(&t[nt - 1])) {
            if (nt == 3 && parse_i32(&t[1], &lv))
                __atomic_store_n(&nvc_srv.verbose, (int)lv, __ATOMIC_RELAXED);
            return 0;
        }
        if (!parse_i32(&t[1], &lv)) {
            OUTS(c, "CLIENT_ERROR bad command line format\r\n");
            return 0;
        }
        __atomic_store_n(&nvc_srv.verbose, (int)lv, __ATOMIC_RELAXED);
        if (!is_noreply(&t[nt - 1]))
            OUTS(c, "OK\r\n");
    } else {
        OUTS(c, "ERROR\r\n");
    }
    return 0;
}

static bool get_prefix(const char *p, size_t n)
{
    return (n >= 4 && (memcmp(p, "get ", 4) == 0 || memcmp(p, "gat ", 4) == 0)) ||
           (n >= 5 && (memcmp(p, "gets ", 5) == 0 || memcmp(p, "gats ", 5) == 0));
}

int nvc_proto_process(nvc_conn *c)
{
    for (;;) {
        if (!c->in)
            return 0;              /* no input buffered */
        char *in = c->in + c->in_start;
        size_t avail = c->in_end - c->in_start;
        if (c->state == CONN_SWALLOW) {
            size_t n = avail < c->swallow ? avail : c->swallow;
            c->in_start += n;
            NVC_COUNT(&c->w->cnt, bytes_read, n);
            c->swallow -= n;
            if (c->swallow)
                return 0;
            c->state = CONN_LINE;
            continue;
        }
        if (c->state == CONN_DATA) {
            size_t need = c->p.bytes + 2;
            if (avail < need)
                return 0;
            /* The data goes straight behind the header room of the scratch
             * buffer, where put_item would copy it anyway. */
            char *scratch = nvc_scratch(c->w, sizeof(nvc_hdr) + need);
            if (!scratch) {
                OUTS(c, "SERVER_ERROR out of memory reading request\r\n");
                return -1;
            }
            char *buf = scratch + sizeof(nvc_hdr);
            memcpy(buf, in, need);
            c->in_start += need;
            NVC_COUNT(&c->w->cnt, bytes_read, need);
            c->state = CONN_LINE;
            if (buf[need - 2] != '\r' || buf[need - 1] != '\n') {
                if (!c->p.noreply)
                    OUTS(c, "CLIENT_ERROR bad data chunk\r\n");
            } else {
                complete_update(c, buf);
            }
            continue;
        }
        if (avail == 0)
            return 0;
        /* A line. The binary protocol starts with its magic byte. */
        if ((unsigned char)in[0] == 0x80) {
            NVC_COUNT(&c->w->cnt, protocol_errors, 1);
            OUTS(c, "CLIENT_ERROR binary protocol not supported\r\n");
            return -1;
        }
        size_t limit = get_prefix(in, avail < 8 ? avail : 8) ? NVC_GET_LINE_MAX : NVC_LINE_MAX;
        char *nl = memchr(in, '\n', avail < limit + 1 ? avail : limit + 1);
        if (!nl) {
            if (avail > limit) {
                NVC_COUNT(&c->w->cnt, protocol_errors, 1);
                OUTS(c, "CLIENT_ERROR line too long\r\n");
                return -1;
            }
            return 0;
        }
        /* Parsed where it lies; consumed once dispatched. */
        size_t len = (size_t)(nl - in);
        NVC_COUNT(&c->w->cnt, bytes_read, len + 1);
        c->in_start += len + 1;
        if (len > 0 && in[len - 1] == '\r')
            len--;
        in[len] = '\0';
        if (__atomic_load_n(&nvc_srv.verbose, __ATOMIC_RELAXED) > 1)
            fprintf(stderr, "<%p %.*s\n", (void *)c, (int)(len < 200 ? len : 200), in);
        if (dispatch(c, in, len) < 0)
            return -1;
        /* Let main.c pause a client whose replies pile up. */
        if (c->pending > NVC_OUT_HIGH)
            return 0;
    }
}
