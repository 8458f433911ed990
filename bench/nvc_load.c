/* nvc_load.c — a closed-loop memcached text-protocol load generator that
 * measures the latency of every request (bench_nvcached's percentiles).
 *
 * memcaslap reports latency only in log2 buckets (p99 "8 ms" means anywhere
 * in 4..8 ms), too coarse to compare two servers' tails. This client keeps
 * every request's round trip (one outstanding request per connection, as
 * memcaslap does) and reports exact percentiles of the samples:
 *
 *   nvc_load -p PORT [-T threads] [-c conns per thread] [-t seconds]
 *            [-v value bytes] [-s set fraction] [-k keys]
 *
 * Keys are 32 bytes ("key" + zero-padded number) drawn uniformly from -k
 * keys, which are stored first (pipelined, noreply) so gets hit. Output, one
 * line: ops_per_s p50_us p90_us p99_us p999_us max_us (loopback only). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define KEYLEN 32

static int g_port = 11211, g_threads = 2, g_conns = 16, g_secs = 10, g_vlen = 100;
static double g_set = 0.1;
static unsigned g_keys = 50000;
static char *g_value;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int dial(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void key_of(unsigned k, char *out) { snprintf(out, KEYLEN + 1, "key%029u", k); }

static int send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Store every key once (noreply, pipelined), then a "mn"-free sync: a get
 * of the last key, whose answer comes after every set was handled. */
static int preload(void)
{
    int fd = dial();
    if (fd < 0) return -1;
    size_t cap = (size_t)(KEYLEN + 64 + g_vlen) * 256, len = 0;
    char *buf = malloc(cap), key[KEYLEN + 1];
    for (unsigned k = 0; k < g_keys; k++) {
        key_of(k, key);
        len += (size_t)sprintf(buf + len, "set %s 0 0 %d noreply\r\n", key, g_vlen);
        memcpy(buf + len, g_value, (size_t)g_vlen);
        len += (size_t)g_vlen;
        memcpy(buf + len, "\r\n", 2);
        len += 2;
        if (k % 256 == 255 || k + 1 == g_keys) {
            if (send_all(fd, buf, len)) return -1;
            len = 0;
        }
    }
    len = (size_t)sprintf(buf, "version\r\n");
    if (send_all(fd, buf, len)) return -1;
    char r[256];
    size_t got = 0;
    while (got < 2 || memcmp(r + got - 2, "\r\n", 2) != 0) {
        ssize_t n = recv(fd, r + got, sizeof r - got, 0);
        if (n <= 0) return -1;
        got += (size_t)n;
    }
    free(buf);
    close(fd);
    return 0;
}

typedef struct conn {
    int fd;
    int is_get;
    uint64_t t0;
    size_t have;
    char in[8192 + 256];
} conn;

typedef struct thr {
    pthread_t t;
    uint64_t seed;
    uint32_t *lat;          /* round trips, in units of 100 ns */
    size_t n, cap;
    uint64_t errors;
} thr;

static volatile int g_stop;

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int issue(thr *t, conn *c, char *buf)
{
    char key[KEYLEN + 1];
    key_of((unsigned)(rnd(&t->seed) % g_keys), key);
    c->is_get = (double)(rnd(&t->seed) >> 11) / 9007199254740992.0 >= g_set;
    size_t len;
    if (c->is_get) {
        len = (size_t)sprintf(buf, "get %s\r\n", key);
    } else {
        len = (size_t)sprintf(buf, "set %s 0 0 %d\r\n", key, g_vlen);
        memcpy(buf + len, g_value, (size_t)g_vlen);
        len += (size_t)g_vlen;
        memcpy(buf + len, "\r\n", 2);
        len += 2;
    }
    c->have = 0;
    c->t0 = now_ns();
    return send_all(c->fd, buf, len);
}

/* A reply is complete: a get's ends with "END\r\n" (the values are 'x'
 * bytes), a set's is one line. */
static int complete(const conn *c)
{
    if (c->is_get) return c->have >= 5 && memcmp(c->in + c->have - 5, "END\r\n", 5) == 0;
    return c->have >= 2 && memcmp(c->in + c->have - 2, "\r\n", 2) == 0;
}

static void *thr_main(void *arg)
{
    thr *t = arg;
    int ep = epoll_create1(0);
    conn *cs = calloc((size_t)g_conns, sizeof *cs);
    char *buf = malloc((size_t)g_vlen + 256);
    for (int i = 0; i < g_conns; i++) {
        cs[i].fd = dial();
        if (cs[i].fd < 0) {
            t->errors++;
            return NULL;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &cs[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &ev);
        if (issue(t, &cs[i], buf)) t->errors++;
    }
    struct epoll_event evs[64];
    while (!g_stop) {
        int n = epoll_wait(ep, evs, 64, 100);
        for (int i = 0; i < n; i++) {
            conn *c = evs[i].data.ptr;
            ssize_t r = recv(c->fd, c->in + c->have, sizeof c->in - c->have, 0);
            if (r <= 0) {
                t->errors++;
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                continue;
            }
            c->have += (size_t)r;
            if (!complete(c)) {
                if (c->have == sizeof c->in) c->have = 0;   /* not ours: resync */
                continue;
            }
            uint64_t d = (now_ns() - c->t0) / 100;
            if (t->n == t->cap) {
                t->cap = t->cap ? t->cap * 2 : 1 << 16;
                t->lat = realloc(t->lat, t->cap * sizeof *t->lat);
            }
            t->lat[t->n++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
            if (!g_stop && issue(t, c, buf)) t->errors++;
        }
    }
    for (int i = 0; i < g_conns; i++) close(cs[i].fd);
    close(ep);
    free(cs);
    free(buf);
    return NULL;
}

static int cmp32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int o;
    while ((o = getopt(argc, argv, "p:T:c:t:v:s:k:")) != -1) {
        switch (o) {
        case 'p': g_port = atoi(optarg); break;
        case 'T': g_threads = atoi(optarg); break;
        case 'c': g_conns = atoi(optarg); break;
        case 't': g_secs = atoi(optarg); break;
        case 'v': g_vlen = atoi(optarg); break;
        case 's': g_set = atof(optarg); break;
        case 'k': g_keys = (unsigned)atoi(optarg); break;
        default:
            fprintf(stderr, "usage: nvc_load -p PORT [-T threads] [-c conns/thread] [-t s] "
                            "[-v bytes] [-s set fraction] [-k keys]\n");
            return 2;
        }
    }
    if (g_threads < 1 || g_conns < 1 || g_secs < 1 || g_vlen < 1 || g_vlen > 8192 || !g_keys) {
        fprintf(stderr, "nvc_load: bad arguments\n");
        return 2;
    }
    g_value = malloc((size_t)g_vlen);
    memset(g_value, 'x', (size_t)g_vlen);
    if (preload()) {
        fprintf(stderr, "nvc_load: cannot load the keys on port %d\n", g_port);
        return 1;
    }
    thr *ts = calloc((size_t)g_threads, sizeof *ts);
    uint64_t t0 = now_ns();
    for (int i = 0; i < g_threads; i++) {
        ts[i].seed = 0x1234567ull * (uint64_t)(i + 1);
        pthread_create(&ts[i].t, NULL, thr_main, &ts[i]);
    }
    struct timespec sl = {.tv_sec = g_secs};
    nanosleep(&sl, NULL);
    g_stop = 1;
    size_t n = 0;
    uint64_t errors = 0;
    for (int i = 0; i < g_threads; i++) {
        pthread_join(ts[i].t, NULL);
        n += ts[i].n;
        errors += ts[i].errors;
    }
    double secs = (double)(now_ns() - t0) / 1e9;
    if (!n || errors) {
        fprintf(stderr, "nvc_load: %zu requests, %llu errors\n", n, (unsigned long long)errors);
        return 1;
    }
    uint32_t *all = malloc(n * sizeof *all);
    size_t k = 0;
    for (int i = 0; i < g_threads; i++) {
        memcpy(all + k, ts[i].lat, ts[i].n * sizeof *all);
        k += ts[i].n;
    }
    qsort(all, n, sizeof *all, cmp32);
#define PCT(p) (all[(size_t)((double)(n - 1) * (p))] / 10.0)
    printf("%.0f %.1f %.1f %.1f %.1f %.1f\n", (double)n / secs, PCT(0.5), PCT(0.9), PCT(0.99),
           PCT(0.999), all[n - 1] / 10.0);
    return 0;
}
