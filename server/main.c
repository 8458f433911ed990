/* main.c — nvcached: options, the listening socket, one libevent loop per
 * worker thread, connections, and a graceful stop on SIGTERM/SIGINT.
 *
 * The main thread accepts and deals each connection to the worker with the
 * fewest (memcached's model, there round robin), through that worker's
 * notification pipe; every worker runs its own event_base, so a connection
 * lives on one thread and needs no locking of its own; items are shared
 * through the store and its locks (store.h). Dealing evenly matters: when
 * the workers accepted from the shared socket themselves, whichever woke
 * first took most of a burst of connects (splits of 28 to 4 and 32 to 1
 * were common), so one worker served nearly every request while the other
 * idled, and throughput and tail latency changed from one start to the
 * next with the split. */
#include "nvcached.h"

#include <nvheap.h>

#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

nvc_server nvc_srv;

static void usage(FILE *f)
{
    fprintf(f,
        "nvcached " NVC_VERSION " — a memcached-compatible cache whose items survive kill -9\n"
        "usage: nvcached [options]\n"
        "  -p, --port=PORT          TCP port (default 11211)\n"
        "  -l, --listen=ADDR        address to listen on (default 127.0.0.1)\n"
        "  -m, --memory-limit=MiB   item memory limit (default 64)\n"
        "  -c, --conn-limit=N       max simultaneous connections (default 1024)\n"
        "  -t, --threads=N          worker threads (default 4)\n"
        "  -I, --max-item-size=SIZE largest item, k/m suffix allowed (default 1m)\n"
        "  -M, --disable-evictions  answer SERVER_ERROR out of memory instead of evicting\n"
        "  -v, --verbose            log errors (-vv: every command)\n"
        "      --pool=PATH          pool file (default ./nvcached.pool; created if missing)\n"
        "      --domain=NAME        persistence domain: pmem, eadr, msync, process\n"
        "                           (default: detected from the file system)\n"
        "      --no-populate        let the pool's pages fault in one by one as items\n"
        "                           first touch them (default: populate the space the\n"
        "                           allocator takes, 2 MiB at a time)\n"
        "  -h, --help               this text\n"
        "  -V, --version            the version\n"
        "Every acknowledged change (STORED, DELETED, ...) is durable in the pool's\n"
        "domain before the reply is sent. See docs/NVCACHED.md.\n");
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    if (*end == 'k' || *end == 'K')
        v <<= 10, end++;
    else if (*end == 'm' || *end == 'M')
        v <<= 20, end++;
    if (*end)
        return -1;
    *out = (size_t)v;
    return 0;
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* ---- connections -------------------------------------------------------- */

static void conn_free(nvc_conn *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        c->w->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    event_free(c->rev);
    event_free(c->wev);
    free(c->in);
    free(c->out);
    close(c->fd);
    __atomic_fetch_sub(&c->w->nconns, 1, __ATOMIC_RELAXED);
    free(c);
    __atomic_fetch_sub(&nvc_srv.curr_conns, 1, __ATOMIC_RELAXED);
}

/* ---- output ------------------------------------------------------------- */

static void out_release(nvc_conn *c)
{
    nvc_worker *w = c->w;
    if (c->out_cap == NVC_OUT_CHUNK && w->nospare < NVC_IN_SPARES)
        w->ospare[w->nospare++] = c->out;
    else
        free(c->out);
    c->out = NULL;
    c->out_len = c->out_cap = 0;
}

/* Room for n more copied bytes; false if out of memory. */
static bool out_room(nvc_conn *c, size_t n)
{
    if (c->out_cap - c->out_len >= n)
        return true;
    if (!c->out && n <= NVC_OUT_CHUNK) {
        nvc_worker *w = c->w;
        c->out = w->nospare ? w->ospare[--w->nospare] : malloc(NVC_OUT_CHUNK);
        if (!c->out)
            return false;
        c->out_cap = NVC_OUT_CHUNK;
        return true;
    }
    size_t cap = c->out_cap ? c->out_cap : NVC_OUT_CHUNK;
    while (cap - c->out_len < n)
        cap *= 2;
    char *p = realloc(c->out, cap);
    if (!p)
        return false;
    c->out = p;
    c->out_cap = cap;
    return true;
}

/* A failed allocation drops the reply bytes: the connection is then
 * closed (out_failed), as a client must not see a reply with a hole. */
static void out_failed(nvc_conn *c)
{
    c->closing = true;
    c->out_broken = true;
}

/* The unsent output as one segment of copied bytes in a buffer of its
 * own (references copied too: after it none is left). False if out of
 * memory. */
static bool out_compact(nvc_conn *c)
{
    size_t cap = NVC_OUT_CHUNK;
    while (cap < c->pending)
        cap *= 2;
    char *buf = malloc(cap), *p = buf;
    if (!buf)
        return false;
    for (int i = c->seg_head; i < c->nseg; i++) {
        const struct nvc_seg *g = &c->seg[i];
        size_t skip = i == c->seg_head ? c->head_done : 0;
        memcpy(p, (g->ref ? g->ref : c->out + g->off) + skip, g->len - skip);
        p += g->len - skip;
    }
    free(c->out);
    c->out = buf;
    c->out_cap = cap;
    c->out_len = c->pending;
    c->seg[0] = (struct nvc_seg){ NULL, 0, c->pending };
    c->seg_head = 0;
    c->nseg = c->pending ? 1 : 0;
    c->head_done = 0;
    return true;
}

void nvc_out(nvc_conn *c, const void *p, size_t n)
{
    if (n == 0 || c->out_broken)
        return;
    struct nvc_seg *last = c->nseg > c->seg_head ? &c->seg[c->nseg - 1] : NULL;
    bool extend = last && !last->ref && last->off + last->len == c->out_len;
    if (!extend && c->nseg == NVC_OUT_SEGS) {
        if (!out_compact(c)) {
            out_failed(c);
            return;
        }
        last = &c->seg[0];
        extend = true;
    }
    if (!out_room(c, n)) {
        out_failed(c);
        return;
    }
    memcpy(c->out + c->out_len, p, n);
    if (extend) {
        last->len += n;
    } else {
        c->seg[c->nseg++] = (struct nvc_seg){ NULL, c->out_len, n };
    }
    c->out_len += n;
    c->pending += n;
}

bool nvc_out_ref(nvc_conn *c, const void *p, size_t n)
{
    /* keep two segments free: the copy after this one, and the next */
    if (c->out_broken || c->nseg > NVC_OUT_SEGS - 3)
        return false;
    c->seg[c->nseg++] = (struct nvc_seg){ p, 0, n };
    c->pending += n;
    return true;
}

/* Writes what it can now (one writev of every segment); the rest waits for
 * the socket (write event). Returns -1 if the connection is gone. */
static int conn_flush(nvc_conn *c)
{
    while (c->pending > 0 && !c->out_broken) {
        struct iovec iov[NVC_OUT_SEGS];
        int n = 0;
        for (int i = c->seg_head; i < c->nseg; i++, n++) {
            const struct nvc_seg *g = &c->seg[i];
            const char *base = g->ref ? g->ref : c->out + g->off;
            size_t skip = i == c->seg_head ? c->head_done : 0;
            iov[n].iov_base = (void *)(base + skip);
            iov[n].iov_len = g->len - skip;
        }
        ssize_t wr = writev(c->fd, iov, n);
        if (wr < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                break;
            return -1;
        }
        if (wr == 0)
            break;
        NVC_COUNT(&c->w->cnt, bytes_written, (uint64_t)wr);
        size_t left = (size_t)wr;
        c->pending -= left;
        while (left > 0) {
            struct nvc_seg *g = &c->seg[c->seg_head];
            size_t rest = g->len - c->head_done;
            if (left < rest) {
                c->head_done += left;
                break;
            }
            left -= rest;
            c->seg_head++;
            c->head_done = 0;
        }
    }
    if (c->pending == 0) {
        c->seg_head = c->nseg = 0;
        c->head_done = 0;
        if (c->out)
            out_release(c);
    }
    if (c->pending > 0 && !c->out_broken) {
        if (!c->wev_on) {
            event_add(c->wev, NULL);
            c->wev_on = true;
        }
    } else if (c->wev_on) {
        event_del(c->wev);
        c->wev_on = false;
    }
    return c->out_broken ? -1 : 0;
}

static void conn_read_enable(nvc_conn *c, bool on)
{
    if (on != c->rev_on) {
        if (on)
            event_add(c->rev, NULL);
        else
            event_del(c->rev);
        c->rev_on = on;
    }
}

void nvc_conn_read_section(nvc_conn *c)
{
    if (!c->w->reading) {
        nvc_store_read_begin(nvc_srv.store);
        c->w->reading = true;
    }
}

/* Ends the worker's read section after the flush: output that could not
 * be written yet may still reference item data, so that is copied into
 * the connection's own buffer first (the rare case of a full socket).
 * Returns -1 if out of memory. */
static int conn_read_section_end(nvc_conn *c)
{
    int rc = 0;
    bool refs = false;
    for (int i = c->seg_head; i < c->nseg; i++)
        refs |= c->seg[i].ref != NULL;
    if (refs && !out_compact(c))
        rc = -1;
    nvc_store_read_end(nvc_srv.store);
    c->w->reading = false;
    return rc;
}

/* Process what is buffered, reply at once (no extra loop pass: replies
 * to one read go out in one writev), and decide whether to keep reading.
 * Large values go out from their place in the pool, inside a read section
 * that ends here, once the writev is done. */
static void conn_run(nvc_conn *c)
{
    if (!c->closing && nvc_proto_process(c) < 0)
        c->closing = true;
    int rc = conn_flush(c);
    if (c->w->reading && conn_read_section_end(c) < 0)
        rc = -1;
    if (rc < 0) {
        conn_free(c);
        return;
    }
    size_t pending = c->pending;
    if (c->closing) {
        conn_read_enable(c, false);
        if (pending == 0)
            conn_free(c);
        return;
    }
    /* A client that does not read its replies is not read from until they
     * drain; input is bounded by the largest thing one request may need. */
    c->paused = pending > NVC_OUT_HIGH;
    conn_read_enable(c, !c->paused &&
                     c->in_end - c->in_start < nvc_srv.set.item_max + NVC_GET_LINE_MAX);
    if (c->in && c->in_start == c->in_end) {
        /* nothing unconsumed: the buffer goes back to the worker */
        nvc_worker *w = c->w;
        if (c->in_cap == NVC_IN_CHUNK && w->nspare < NVC_IN_SPARES)
            w->spare[w->nspare++] = c->in;
        else
            free(c->in);
        c->in = NULL;
        c->in_start = c->in_end = c->in_cap = 0;
    }
}

/* Room for a read behind the unconsumed input: a spare buffer of the
 * worker if the connection has none, the unconsumed rest moved to the
 * front, the buffer doubled when that is not enough. Returns the free
 * bytes (0 if out of memory). */
static size_t conn_in_room(nvc_conn *c)
{
    if (!c->in) {
        nvc_worker *w = c->w;
        c->in = w->nspare ? w->spare[--w->nspare] : malloc(NVC_IN_CHUNK);
        if (!c->in)
            return 0;
        c->in_cap = NVC_IN_CHUNK;
        c->in_start = c->in_end = 0;
    }
    if (c->in_cap - c->in_end >= NVC_IN_CHUNK / 2)
        return c->in_cap - c->in_end;
    if (c->in_start > 0) {
        memmove(c->in, c->in + c->in_start, c->in_end - c->in_start);
        c->in_end -= c->in_start;
        c->in_start = 0;
    }
    if (c->in_cap - c->in_end < NVC_IN_CHUNK / 2) {
        char *p = realloc(c->in, 2 * c->in_cap);
        if (!p)
            return 0;
        c->in = p;
        c->in_cap *= 2;
    }
    return c->in_cap - c->in_end;
}

static void read_cb(evutil_socket_t fd, short what, void *arg)
{
    nvc_conn *c = arg;
    (void)what;
    size_t room = conn_in_room(c);
    if (room == 0) {
        conn_free(c);
        return;
    }
    ssize_t n = recv(fd, c->in + c->in_end, room, 0);
    if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        conn_free(c);              /* EOF or error: the client is gone */
        return;
    }
    c->in_end += (size_t)n;
    conn_run(c);
}

static void write_cb(evutil_socket_t fd, short what, void *arg)
{
    nvc_conn *c = arg;
    (void)fd, (void)what;
    if (conn_flush(c) < 0) {
        conn_free(c);
        return;
    }
    if (c->pending == 0 && c->closing) {
        conn_free(c);
        return;
    }
    if (c->paused && c->pending <= NVC_OUT_HIGH / 2)
        conn_run(c);               /* requests already buffered */
}

/* A connection dealt to w (by accept_cb, counted in curr_conns and in
 * w->nconns): its events on w's loop. */
static void conn_new(nvc_worker *w, evutil_socket_t fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    evutil_make_socket_nonblocking(fd);
    nvc_conn *c = calloc(1, sizeof *c);
    if (c) {
        c->fd = fd;
        c->w = w;
        c->rev = event_new(w->base, fd, EV_READ | EV_PERSIST, read_cb, c);
        c->wev = event_new(w->base, fd, EV_WRITE | EV_PERSIST, write_cb, c);
    }
    if (!c || !c->rev || !c->wev) {
        if (c) {
            if (c->rev) event_free(c->rev);
            if (c->wev) event_free(c->wev);
            free(c);
        }
        close(fd);
        __atomic_fetch_sub(&w->nconns, 1, __ATOMIC_RELAXED);
        __atomic_fetch_sub(&nvc_srv.curr_conns, 1, __ATOMIC_RELAXED);
        return;
    }
    c->next = w->conns;
    if (w->conns)
        w->conns->prev = c;
    w->conns = c;
    c->state = CONN_LINE;
    conn_read_enable(c, true);
}

/* The worker's notification pipe: sockets dealt to it, an int each (a
 * write of 4 bytes to a pipe is atomic). */
static void notify_cb(evutil_socket_t pfd, short what, void *arg)
{
    (void)what;
    int fds[64];
    ssize_t n;
    while ((n = read(pfd, fds, sizeof fds)) > 0)
        for (ssize_t i = 0; i < n / (ssize_t)sizeof fds[0]; i++)
            conn_new(arg, fds[i]);
}

/* The worker with the fewest connections, ties in turn: even over the
 * workers whatever the order of connects and closes. */
static nvc_worker *deal_worker(void)
{
    static unsigned turn;
    int n = nvc_srv.set.threads, best = -1;
    uint64_t least = UINT64_MAX;
    for (int k = 0; k < n; k++) {
        int i = (int)((turn + (unsigned)k) % (unsigned)n);
        uint64_t c = __atomic_load_n(&nvc_srv.workers[i].nconns, __ATOMIC_RELAXED);
        if (c < least)
            least = c, best = i;
    }
    turn = (unsigned)best + 1;
    return &nvc_srv.workers[best];
}

/* Main thread: accept, refuse over the limit, deal to a worker. */
static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg)
{
    (void)l, (void)sa, (void)salen, (void)arg;
    uint64_t n = __atomic_add_fetch(&nvc_srv.curr_conns, 1, __ATOMIC_RELAXED);
    if (n > (uint64_t)nvc_srv.set.maxconns) {
        static const char msg[] = "ERROR Too many open connections\r\n";
        ssize_t wr = write(fd, msg, sizeof msg - 1);
        (void)wr;
        close(fd);
        __atomic_fetch_sub(&nvc_srv.curr_conns, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&nvc_srv.rejected_conns, 1, __ATOMIC_RELAXED);
        return;
    }
    __atomic_fetch_add(&nvc_srv.total_conns, 1, __ATOMIC_RELAXED);
    nvc_worker *w = deal_worker();
    __atomic_fetch_add(&w->nconns, 1, __ATOMIC_RELAXED);
    int v = fd;
    if (write(w->notify_wr, &v, sizeof v) != (ssize_t)sizeof v) {
        close(fd);                 /* the pipe is full: thousands undelivered */
        __atomic_fetch_sub(&w->nconns, 1, __ATOMIC_RELAXED);
        __atomic_fetch_sub(&nvc_srv.curr_conns, 1, __ATOMIC_RELAXED);
    }
}

char *nvc_scratch(nvc_worker *w, size_t n)
{
    if (n > w->scratch_cap) {
        size_t cap = w->scratch_cap ? w->scratch_cap : 4096;
        while (cap < n)
            cap *= 2;
        char *p = realloc(w->scratch, cap);
        if (!p)
            return NULL;
        w->scratch = p;
        w->scratch_cap = cap;
    }
    return w->scratch;
}

void nvc_counters_sum(nvc_counters *out)
{
    memset(out, 0, sizeof *out);
    uint64_t *o = (uint64_t *)out;
    for (int i = 0; i < nvc_srv.set.threads; i++) {
        uint64_t *p = (uint64_t *)&nvc_srv.workers[i].cnt;
        for (size_t k = 0; k < sizeof *out / sizeof(uint64_t); k++)
            o[k] += __atomic_load_n(&p[k], __ATOMIC_RELAXED);
    }
}

/* ---- startup ------------------------------------------------------------ */

static evutil_socket_t listen_socket(const char *addr, int port)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
    struct addrinfo *res;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    int rc = getaddrinfo(addr, portstr, &hints, &res);
    if (rc) {
        fprintf(stderr, "nvcached: -l %s: %s\n", addr, gai_strerror(rc));
        return -1;
    }
    evutil_socket_t fd = -1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0)
            break;
        fprintf(stderr, "nvcached: listening on %s:%d: %s\n", addr, port, strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static void *worker_main(void *arg)
{
    nvc_worker *w = arg;
    event_base_dispatch(w->base);
    return NULL;
}

static void stop_cb(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    if (nvc_srv.set.verbose)
        fprintf(stderr, "nvcached: signal %d, stopping\n", (int)sig);
    /* loopexit, not loopbreak: a worker that has not entered its loop yet
     * would clear a break flag when it does, and never stop. */
    for (int i = 0; i < nvc_srv.set.threads; i++)
        event_base_loopexit(nvc_srv.workers[i].base, NULL);
    event_base_loopbreak(arg);
}

int main(int argc, char **argv)
{
    nvc_settings *set = &nvc_srv.set;
    *set = (nvc_settings){ .port = 11211, .addr = "127.0.0.1", .maxbytes = 64ull << 20,
                           .maxconns = 1024, .threads = 4, .item_max = 1u << 20,
                           .pool = "./nvcached.pool" };
    enum { OPT_POOL = 1000, OPT_DOMAIN, OPT_NO_POPULATE };
    bool populate = true;
    static const struct option opts[] = {
        { "port", required_argument, NULL, 'p' },
        { "listen", required_argument, NULL, 'l' },
        { "memory-limit", required_argument, NULL, 'm' },
        { "conn-limit", required_argument, NULL, 'c' },
        { "threads", required_argument, NULL, 't' },
        { "max-item-size", required_argument, NULL, 'I' },
        { "disable-evictions", no_argument, NULL, 'M' },
        { "verbose", no_argument, NULL, 'v' },
        { "pool", required_argument, NULL, OPT_POOL },
        { "domain", required_argument, NULL, OPT_DOMAIN },
        { "no-populate", no_argument, NULL, OPT_NO_POPULATE },
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, 'V' },
        { NULL, 0, NULL, 0 },
    };
    int o;
    long v;
    size_t sz;
    while ((o = getopt_long(argc, argv, "p:l:m:c:t:I:MvhV", opts, NULL)) != -1) {
        switch (o) {
        case 'p':
            if (parse_int(optarg, 0, 65535, &v)) goto bad;
            set->port = (int)v;
            break;
        case 'l': set->addr = optarg; break;
        case 'm':
            if (parse_int(optarg, 1, 1L << 30, &v)) goto bad;
            set->maxbytes = (uint64_t)v << 20;
            break;
        case 'c':
            if (parse_int(optarg, 1, 1L << 24, &v)) goto bad;
            set->maxconns = (int)v;
            break;
        case 't':
            if (parse_int(optarg, 1, 256, &v)) goto bad;
            set->threads = (int)v;
            break;
        case 'I':
            if (parse_size(optarg, &sz) || sz < 1024 || sz > (128u << 20)) {
                fprintf(stderr, "nvcached: -I must be between 1k and 128m\n");
                return 2;
            }
            set->item_max = sz;
            break;
        case 'M': set->no_evict = true; break;
        case 'v': set->verbose++; break;
        case OPT_POOL: set->pool = optarg; break;
        case OPT_DOMAIN: {
            nvh_domain d;
            if (nvh_domain_parse(optarg, &d) || d == NVH_DOMAIN_SIM) goto bad;
            set->pool_flags = (unsigned)d;
            break;
        }
        case OPT_NO_POPULATE: populate = false; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("nvcached " NVC_VERSION " (memcached protocol 1.6.18, nvheap %d.%d.%d)\n",
                         NVH_VERSION_MAJOR, NVH_VERSION_MINOR, NVH_VERSION_PATCH);
                  return 0;
        default: usage(stderr); return 2;
        }
        continue;
    bad:
        fprintf(stderr, "nvcached: bad value for -%c: %s\n", o < 256 ? o : '-', optarg);
        return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "nvcached: unexpected argument %s\n", argv[optind]);
        return 2;
    }
    /* Every set writes a fresh allocation, and a cache that is filling
     * takes fresh pool space all the time: populating it as the allocator
     * claims it (NVH_POOL_POPULATE) replaces a page fault per 4 KiB of item
     * data by one MADV_POPULATE_WRITE per 2 MiB. Nothing is populated at
     * open, so a restart is not slowed down. */
    if (populate)
        set->pool_flags |= NVH_POOL_POPULATE;
    nvc_srv.verbose = set->verbose;
    signal(SIGPIPE, SIG_IGN);
    evthread_use_pthreads();
    /* Signals first: a SIGTERM from the moment the port is open on must
     * reach stop_cb (the default action would skip the clean close). */
    struct event_base *mainbase = event_base_new();
    struct event *sigterm = mainbase ? evsignal_new(mainbase, SIGTERM, stop_cb, mainbase) : NULL;
    struct event *sigint = mainbase ? evsignal_new(mainbase, SIGINT, stop_cb, mainbase) : NULL;
    if (!sigterm || !sigint || evsignal_add(sigterm, NULL) || evsignal_add(sigint, NULL)) {
        fprintf(stderr, "nvcached: cannot set up the event loop\n");
        return 1;
    }

    char err[512];
    nvc_store_config sc = { .path = set->pool, .pool_flags = set->pool_flags,
                            .limit_bytes = set->maxbytes, .no_evict = set->no_evict };
    nvc_srv.store = nvc_store_open(&sc, err, sizeof err);
    if (!nvc_srv.store) {
        fprintf(stderr, "nvcached: %s\n", err);
        return 1;
    }
    nvc_srv.started = time(NULL);
    evutil_socket_t fd = listen_socket(set->addr, set->port);
    if (fd < 0) {
        nvc_store_close(nvc_srv.store);
        return 1;
    }
    nvc_srv.workers = calloc((size_t)set->threads, sizeof *nvc_srv.workers);
    pthread_t *tids = calloc((size_t)set->threads, sizeof *tids);
    if (!nvc_srv.workers || !tids) {
        fprintf(stderr, "nvcached: out of memory\n");
        return 1;
    }
    for (int i = 0; i < set->threads; i++) {
        nvc_worker *w = &nvc_srv.workers[i];
        int pp[2];
        w->base = event_base_new();
        if (!w->base || pipe2(pp, O_NONBLOCK | O_CLOEXEC) != 0) {
            fprintf(stderr, "nvcached: cannot start worker %d\n", i);
            return 1;
        }
        w->notify_rd = pp[0];
        w->notify_wr = pp[1];
        w->notify_ev = event_new(w->base, pp[0], EV_READ | EV_PERSIST, notify_cb, w);
        if (!w->notify_ev || event_add(w->notify_ev, NULL) != 0) {
            fprintf(stderr, "nvcached: cannot start worker %d\n", i);
            return 1;
        }
    }
    struct evconnlistener *listener = evconnlistener_new(mainbase, accept_cb, NULL, 0, -1, fd);
    if (!listener) {
        fprintf(stderr, "nvcached: cannot listen\n");
        return 1;
    }
    for (int i = 0; i < set->threads; i++)
        pthread_create(&tids[i], NULL, worker_main, &nvc_srv.workers[i]);
    if (set->verbose)
        fprintf(stderr, "nvcached: serving %s on %s:%d, %d threads\n", set->pool, set->addr,
                set->port, set->threads);
    event_base_dispatch(mainbase);
    for (int i = 0; i < set->threads; i++)
        pthread_join(tids[i], NULL);
    /* Connections still open are dropped with the process; every reply
     * they were sent was durable already. */
    evconnlistener_free(listener);
    for (int i = 0; i < set->threads; i++) {
        nvc_worker *w = &nvc_srv.workers[i];
        while (w->conns)
            conn_free(w->conns);
        int undelivered;           /* dealt, not yet taken by the worker */
        while (read(w->notify_rd, &undelivered, sizeof undelivered) == sizeof undelivered)
            close(undelivered);
        event_free(w->notify_ev);
        close(w->notify_rd);
        close(w->notify_wr);
        event_base_free(w->base);
    }
    close(fd);
    nvc_store_close(nvc_srv.store);
    event_free(sigterm);
    event_free(sigint);
    event_base_free(mainbase);
    for (int i = 0; i < set->threads; i++) {
        free(nvc_srv.workers[i].scratch);
        while (nvc_srv.workers[i].nspare > 0)
            free(nvc_srv.workers[i].spare[--nvc_srv.workers[i].nspare]);
        while (nvc_srv.workers[i].nospare > 0)
            free(nvc_srv.workers[i].ospare[--nvc_srv.workers[i].nospare]);
    }
    free(nvc_srv.workers);
    free(tids);
    return 0;
}
