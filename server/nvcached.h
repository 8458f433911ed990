/* nvcached.h — what the server's files share: settings, workers,
 * connections, counters. main.c runs the event loops and the connections;
 * proto.c speaks the text and meta protocols; store.c keeps the items. */
#ifndef NVCACHED_H
#define NVCACHED_H

#include "store.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct event;

#define NVC_VERSION "1.0.0"
/* What `version` answers: memcached's protocol level first (clients parse
 * the leading numbers), then ours. */
#define NVC_VERSION_REPLY "VERSION 1.6.18-nvcached-" NVC_VERSION "\r\n"
#define NVC_LINE_MAX 2048u            /* a command line (memcached's key line limit) */
#define NVC_GET_LINE_MAX (256u << 10) /* a get/gets/gat line (many keys) */
#define NVC_OUT_HIGH (4u << 20)       /* stop reading a client whose replies pile up */
#define NVC_IN_CHUNK (16u << 10)      /* an input buffer; a larger request grows it */
#define NVC_IN_SPARES 8               /* input buffers a worker keeps for reuse */
#define NVC_OUT_CHUNK (4u << 10)      /* an output buffer; more output grows it */
#define NVC_OUT_SEGS 32               /* output segments of a connection (refs + copies) */

typedef struct nvc_settings {
    int port;
    const char *addr;
    uint64_t maxbytes;
    int maxconns;
    int threads;
    size_t item_max;
    bool no_evict;
    int verbose;
    const char *pool;
    unsigned pool_flags;
} nvc_settings;

/* Per-worker counters, written by their worker only, read by `stats`
 * (relaxed atomics: no locks on the hot path). */
typedef struct nvc_counters {
    uint64_t cmd_get, cmd_set, cmd_flush, cmd_touch, cmd_meta;
    uint64_t get_hits, get_misses, get_expired, get_flushed;
    uint64_t delete_hits, delete_misses, incr_hits, incr_misses, decr_hits, decr_misses;
    uint64_t cas_hits, cas_misses, cas_badval, touch_hits, touch_misses;
    uint64_t bytes_read, bytes_written, store_too_large, store_no_memory;
    uint64_t protocol_errors;
} nvc_counters;

#define NVC_COUNT(c, field, n) __atomic_fetch_add(&(c)->field, (n), __ATOMIC_RELAXED)

struct nvc_conn;

typedef struct nvc_worker {
    struct event_base *base;
    struct nvc_conn *conns;       /* open connections (freed at exit) */
    nvc_counters cnt;
    char *scratch;                /* value assembly (grows up to item_max) */
    size_t scratch_cap;
    bool reading;                 /* in a store read section (nvc_conn_read_section) */
    char *spare[NVC_IN_SPARES];   /* input buffers of NVC_IN_CHUNK no connection holds */
    int nspare;
    char *ospare[NVC_IN_SPARES];  /* output buffers of NVC_OUT_CHUNK, the same way */
    int nospare;
    int notify_rd, notify_wr;     /* pipe: accepted sockets dealt to this worker */
    struct event *notify_ev;
    uint64_t nconns;              /* open + dealt connections (atomic: the acceptor
                                     adds, the worker subtracts, stats reads) */
} nvc_worker;

typedef struct nvc_server {
    nvc_settings set;
    nvc_store *store;
    nvc_worker *workers;
    int64_t started;              /* Unix s */
    uint64_t curr_conns, total_conns, rejected_conns;   /* atomics */
    int verbose;                  /* atomic: `verbosity` changes it */
} nvc_server;

extern nvc_server nvc_srv;

enum { CONN_LINE, CONN_DATA, CONN_SWALLOW };

/* A storage command waiting for its data block. */
typedef struct nvc_pending {
    int cmd;                      /* proto.c's command code */
    bool noreply, meta;
    uint8_t klen;
    char key[NVC_KEY_MAX + 1];
    uint32_t flags;
    int64_t exptime;              /* absolute (0 = never) */
    uint64_t cas;
    size_t bytes;                 /* data bytes, without \r\n */
    /* meta set: the flags to echo */
    char ret[128];
    size_t retlen;
    bool ret_cas, quiet;
} nvc_pending;

typedef struct nvc_conn {
    struct nvc_conn *prev, *next; /* the worker's list */
    int fd;
    struct event *rev, *wev;      /* read and write events */
    bool rev_on, wev_on;
    /* Input: in[in_start, in_end) unconsumed, in_cap bytes. A connection
     * holds a buffer only while it has unconsumed input; an empty one goes
     * back to its worker's spares, so idle connections hold none and a
     * read allocates nothing. */
    char *in;
    size_t in_start, in_end, in_cap;
    /* Output, in order: segments, each a span of the copied bytes in
     * out (by offset: out may move as it grows) or a reference to item
     * data in the pool (valid only inside the worker's read section).
     * Written with one writev; out goes back to the worker's spares once
     * everything is written. */
    char *out;
    size_t out_len, out_cap;
    struct nvc_seg {
        const char *ref;          /* NULL: out + off */
        size_t off, len;
    } seg[NVC_OUT_SEGS];
    int seg_head, nseg;           /* unsent: seg[seg_head..nseg), head_done of the first sent */
    size_t head_done;
    size_t pending;               /* unsent bytes */
    bool out_broken;              /* output lost to an allocation failure: close */
    nvc_worker *w;
    int state;
    size_t swallow;
    bool closing;                 /* close once the output is written */
    bool paused;                  /* reading stopped: output over NVC_OUT_HIGH */
    nvc_pending p;
} nvc_conn;

/* proto.c: handle everything complete in the connection's input. Returns
 * -1 if the connection must be closed at once (after its output). */
int nvc_proto_process(nvc_conn *c);
/* main.c: append n bytes to the connection's output (copied). */
void nvc_out(nvc_conn *c, const void *p, size_t n);
/* main.c: append a reference to n bytes of item data (not copied; the
 * caller is in the worker's read section, see below). False when the
 * connection has no segment left: the caller copies instead. */
bool nvc_out_ref(nvc_conn *c, const void *p, size_t n);
/* main.c: the reply being built references item data in the pool: keep
 * the worker in a store read section (nvc_store_read_begin) until that
 * output is written or copied, which main.c does before the connection's
 * turn ends. */
void nvc_conn_read_section(nvc_conn *c);
/* Scratch buffer of at least n bytes (NULL if out of memory). */
char *nvc_scratch(nvc_worker *w, size_t n);
void nvc_counters_sum(nvc_counters *out);

#endif
