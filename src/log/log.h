/* log.h — internals of the transaction log (layer `log`): the on-media
 * format of the per-thread log lanes (directory, lane headers, segments,
 * records) and the DRAM state the `tx` layer drives.
 *
 * Files:
 *   lane.c     the log directory (named object "nvheap.tx"), lane ownership,
 *              segment chains and their growth, the pool registry
 *   record.c   appending word / range / intent records, checksums, the
 *              commit record, retirement and help-flushing
 *   recover.c  open-time recovery of every lane (restartable)
 *
 * The protocol and why it needs only two fences per transaction are in
 * docs/TX.md; the byte layout is pinned in docs/FORMAT.md ("Transaction log"). */
#ifndef NVH_LOG_H
#define NVH_LOG_H

#include "../common/crc32c.h"
#include "../common/internal.h"
#include "../protect/protect.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

/* ==========================================================================
 * Geometry and constants
 * ========================================================================== */
#define NVH_TX_LANES 64u                     /* threads transacting at once    */
#define NVH_FILTER_FINE_SHIFT 16u            /* lane filter: 64 KiB granules   */
#define NVH_FILTER_FINE_BITS 4096u           /* folded onto 4096 bits          */
#define NVH_FILTER_FINE_WORDS (NVH_FILTER_FINE_BITS / 64u)
#define NVH_FILTER_TX_FINE 8u                /* fine granules a transaction lists */
#define NVH_TX_DIR_NAME "nvheap.tx"
#define NVH_TX_DIR_MAGIC 0x31584c48564e0000ull /* "\0\0NVHLX1" little-endian  */
#define NVH_TX_DIR_VERSION 5u                /* 5: a lazy in-place commit's evidence is
                                                its redo lines alone (docs/FORMAT.md) */
#define NVH_TX_DIR_VERSION_V4 4u             /* read (recovered under its own rules)
                                                and raised to 5 by a read-write open */
#define NVH_REDO_LINES 4u                    /* redo lines per slot (2 slots per lane) */
#define NVH_REDO_WORDS_PER_LINE 2u
#define NVH_REDO_MAX (NVH_REDO_LINES * NVH_REDO_WORDS_PER_LINE) /* words of a one-fence tx */
#define NVH_TX_SEG_MAGIC 0x4745534c48564eull   /* "NVHLSEG"                    */
#define NVH_TX_SEG_MIN 4096u                 /* first segment of a slot        */
#define NVH_TX_LIMIT_DEFAULT ((uint64_t)64 << 20) /* bytes of log per lane     */

/* Lane state word: tid << 11 | check << 3 | slot << 2 | st. One 8-byte
 * word, so no crash (not even the simulator's adversarial word mode) can
 * tear it. The 8-bit check (of tid, slot and st; never 0 for the all-zero
 * fields) makes a zeroed or flipped word detectable: read as IDLE it would
 * make recovery skip an in-flight transaction's rollback. */
enum { NVH_LS_IDLE = 0, NVH_LS_ACTIVE = 1, NVH_LS_COMMITTED = 2 };
static inline uint64_t nvh_ls_chk_(uint64_t v)
{
    return (((v * 0x9E3779B97F4A7C15ull) >> 56) ^ 0xA5u) & 0xFFu;
}
#define NVH_LS_RAW_(tid, slot, st) (((uint64_t)(tid) << 3) | ((uint64_t)(slot) << 2) | (uint64_t)(st))
#define NVH_LS_MAKE(tid, slot, st)                                                   \
    (((uint64_t)(tid) << 11) | (nvh_ls_chk_(NVH_LS_RAW_(tid, slot, st)) << 3) |    \
     ((uint64_t)(slot) << 2) | (uint64_t)(st))
#define NVH_LS_TID(w) ((w) >> 11)
#define NVH_LS_VALID(w) (NVH_LS_MAKE(NVH_LS_TID(w), NVH_LS_SLOT(w), NVH_LS_ST(w)) == (w))

/* Retire word (version 4): tid << 8 | check. Monotonic in the tid, so the
 * "only grows" updates compare encoded words; a zeroed word fails the check
 * instead of un-retiring every transaction of the lane. */
static inline uint64_t nvh_rw_make(uint64_t tid) { return tid << 8 | nvh_ls_chk_(tid ^ 0x5257u); }
static inline bool nvh_rw_valid(uint64_t w) { return nvh_rw_make(w >> 8) == w; }
static inline uint64_t nvh_rw_tid(uint64_t w) { return w >> 8; }
#define NVH_LS_SLOT(w) ((unsigned)(((w) >> 2) & 1u))
#define NVH_LS_ST(w) ((unsigned)((w) & 3u))
#define NVH_TID_LANE_BITS 6u

/* Record kinds */
enum {
    NVH_LR_WORD = 1,   /* up to 8 bytes inside one aligned word: old/new inline */
    NVH_LR_RANGE = 2,  /* any range: old and new copies in the data area       */
    NVH_LR_ALLOC = 3,  /* allocator intent: object reserved by the tx          */
    NVH_LR_FREE = 4,   /* allocator intent: object freed at commit             */
};

/* ==========================================================================
 * On-media structures
 * ========================================================================== */

/* Lane header: one line per lane, in the directory. Version 5: the
 * transaction's first record, when it is an 8-byte word, lives in the
 * header (w0_*), so that ACTIVE and its undo image are one line; valid only
 * when w0_crc checks against the state's tid (nvh_w0_crc). A full commit
 * keeps these fields and appends a segment record for that word (its redo
 * image); version 4 left them zero (reserved). */
struct nvh_lane_hdr {
    _Atomic uint64_t state;     /*  0 NVH_LS_MAKE(tid, slot, st)                 */
    uint64_t slot_head[2];      /*  8 first segment of each slot (pool offset)   */
    uint64_t nrecs;             /* 24 committed: records of the transaction      */
    uint64_t cseq;              /* 32 committed: global commit order             */
    uint32_t commit_crc;        /* 40 committed: CRC32C, see record.c            */
    uint32_t w0_crc;            /* 44 v5: CRC of the inline word record           */
    uint64_t w0_off;            /* 48 v5: its pool offset (8-aligned)            */
    uint64_t w0_old;            /* 56 v5: its old value                          */
};
static_assert(sizeof(struct nvh_lane_hdr) == 64, "lane header is one line");
static_assert(offsetof(struct nvh_lane_hdr, commit_crc) == 40, "lane header layout");
static_assert(offsetof(struct nvh_lane_hdr, w0_crc) == 44, "lane header layout");
static_assert(offsetof(struct nvh_lane_hdr, w0_off) == 48, "lane header layout");
/* The inline word record's check: CRC32C of {tid, offset, old value} XOR
 * 0x57305730 (the tid binds it to the header's transaction: a previous
 * transaction's fields never validate). */
#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static inline uint32_t
nvh_w0_crc_sse42_(uint64_t tid, uint64_t off, uint64_t old)
{
    uint64_t c = __builtin_ia32_crc32di(0xffffffffu, tid);
    c = __builtin_ia32_crc32di(c, off);
    return ~(uint32_t)__builtin_ia32_crc32di(c, old);
}
#endif
static inline uint32_t nvh_w0_crc(uint64_t tid, uint64_t off, uint64_t old)
{
#if defined(__x86_64__)
    /* nvh_crc32c_inline's value, three instructions in line (its general
     * loop is a call for 24 bytes) */
    if (__builtin_expect(atomic_load_explicit(&nvh_crc32c_hw_, memory_order_relaxed) > 0, 1))
        return nvh_w0_crc_sse42_(tid, off, old) ^ 0x57305730u;
#endif
    uint64_t f[3] = {tid, off, old};
    return nvh_crc32c_inline(0, f, sizeof f) ^ 0x57305730u;
}

/* Retire line: one per lane (version 2). A transaction is retired (IDLE)
 * when this word holds its tid, whatever the header's state says. It lives on
 * a line of its own because the header line is written with non-temporal
 * stores (ACTIVE, COMMITTED) while the retirement must be a cached store that
 * another thread's CLWB can write back (help-flushing, record.c): mixing the
 * two kinds of store on one line costs a memory round trip per transaction
 * on CPUs whose flush evicts the line. */
struct nvh_lane_retire {
    _Atomic uint64_t tid;       /*  0 tid of the last retired transaction        */
    uint64_t reserved[7];       /*  8                                            */
};
static_assert(sizeof(struct nvh_lane_retire) == 64, "retire record is one line");

/* Redo line (version 3): the whole durable record of a one-fence word
 * transaction (nvh_tx_write_word, docs/TX.md "One-fence word
 * transactions"). A transaction of n words writes ceil(n/2) lines of one
 * slot of its lane; it is committed when every line is durable and valid
 * (CRC, same tid, idx 0..nlines-1). Committed and not retired (tid greater
 * than the lane's retire word) -> recovery writes the values again, in
 * commit order (cseq) with every other committed transaction. */
struct nvh_redo_line {
    uint64_t tid;               /*  0 transaction id (lane bits = the lane)       */
    uint64_t cseq;              /*  8 global commit order                         */
    uint8_t n;                  /* 16 words in this line (1..2)                   */
    uint8_t idx;                /* 17 index of this line in the transaction       */
    uint8_t nlines;             /* 18 lines of the transaction                    */
    uint8_t nwords;             /* 19 words of the transaction                    */
    uint32_t crc;               /* 20 CRC32C of the line with this field 0, ^ 0xa5a5a5a5 */
    uint64_t w[2][2];           /* 24 {pool offset, new value} per word           */
    uint64_t reserved;          /* 56                                             */
};
static_assert(sizeof(struct nvh_redo_line) == 64, "redo line is one line");
static_assert(offsetof(struct nvh_redo_line, w) == 24, "redo line layout");

/* Directory: the named object "nvheap.tx". Version 1 directories end after
 * `lane` (no retire lines: IDLE is stored in the header's state) and are
 * still opened and used that way. */
struct nvh_tx_dir {
    uint64_t magic;             /*  0 NVH_TX_DIR_MAGIC                           */
    uint32_t version;           /*  8 4 or 5 (NVH_TX_DIR_VERSION)                */
    uint32_t nlanes;            /* 12 NVH_TX_LANES                               */
    uint8_t reserved[48];       /* 16                                            */
    struct nvh_lane_hdr lane[NVH_TX_LANES];      /* 64                           */
    struct nvh_lane_retire retire[NVH_TX_LANES]; /* 64 + 64 * 64 (version 2)     */
    /* version 3: per lane 2 slots of NVH_REDO_LINES redo lines */
    struct nvh_redo_line redo[NVH_TX_LANES][2][NVH_REDO_LINES]; /* 64 + 2 * 64 * 64 */
};
static_assert(offsetof(struct nvh_tx_dir, lane) == 64, "directory layout");
static_assert(offsetof(struct nvh_tx_dir, retire) == 64 + 64 * 64, "directory layout");
static_assert(offsetof(struct nvh_tx_dir, redo) == 64 + 2 * 64 * 64, "directory layout");
#define NVH_TX_DIR_V1_SIZE offsetof(struct nvh_tx_dir, retire)
#define NVH_TX_DIR_V2_SIZE offsetof(struct nvh_tx_dir, redo)

/* Segment: a heap object; header line, then nrec_cap 64-byte record slots
 * (the metadata), then data_cap bytes of data (old and new copies). */
struct nvh_seg {
    uint64_t magic;             /*  0 NVH_TX_SEG_MAGIC                           */
    uint64_t next;              /*  8 next segment of the slot (pool offset)     */
    uint32_t nrec_cap;          /* 16                                            */
    uint32_t data_cap;          /* 20 bytes                                      */
    uint64_t size;              /* 24 bytes of the whole segment                 */
    uint32_t check;             /* 32 nvh_seg_check(): magic, caps, size          */
    uint8_t reserved[28];       /* 36                                            */
};
static_assert(sizeof(struct nvh_seg) == 64, "segment header is one line");
static_assert(offsetof(struct nvh_seg, check) == 32, "segment header layout");
/* The segment's fixed fields (written once, before the segment is linked):
 * `next` is not covered; it is checked by being a valid segment itself. */
static inline uint32_t nvh_seg_check(const struct nvh_seg *s)
{
    uint64_t f[3] = {s->magic, (uint64_t)s->nrec_cap << 32 | s->data_cap, s->size};
    return nvh_crc32c(0x5345474du, f, sizeof f);
}

/* Record: one line. The undo checksum covers bytes 0..31 plus, for ranges,
 * the old copy; `new_word` is written at commit and covered by the commit
 * checksum; `link` (free intents) is cleared by the allocator atomically with
 * the free and is covered by neither. */
struct nvh_txrec {
    uint64_t tid;               /*  0 transaction id                             */
    uint64_t off;               /*  8 target (WORD/RANGE) or object (ALLOC/FREE) */
    uint32_t len;               /* 16 bytes                                      */
    uint16_t kind;              /* 20 NVH_LR_*                                   */
    uint16_t seq;               /* 22 index in the transaction (mod 2^16)        */
    uint64_t old_word;          /* 24 WORD: old bytes; RANGE: data offset in seg */
    uint64_t new_word;          /* 32 WORD: new bytes (commit)                   */
    uint64_t link;              /* 40 FREE: == off until the free is applied      */
    uint32_t reserved;          /* 48                                            */
    uint32_t pad;               /* 52                                            */
    uint32_t crc;               /* 56 undo checksum                              */
    uint32_t pad2;              /* 60                                            */
};
static_assert(sizeof(struct nvh_txrec) == 64, "record is one line");
static_assert(offsetof(struct nvh_txrec, crc) == 56, "record layout");

/* ==========================================================================
 * DRAM structures
 * ========================================================================== */
typedef struct nvh_recref {
    struct nvh_txrec *rec;      /* the record line in the pool                   */
    char *data;                 /* RANGE: old copy (new copy follows, 8-aligned) */
    struct nvh_txrec sh;        /* DRAM shadow: the hot path never reads a line
                                   back after writing it (see nvh_txlog_line_)    */
} nvh_recref;

/* Write windows (stray-write protection, docs/PROTECT.md) a transaction
 * holds open until it ends: the log pages it writes and the application
 * ranges it added, allocated or applies. Recorded only while protection is
 * on, so that every window closed was opened counted (none when off). */
typedef struct nvh_win { const void *p; size_t len; } nvh_win;

typedef struct nvh_lane {
    _Alignas(64) struct nvh_lane_hdr *hdr;
    /* where retirement stores: the retire line's tid (version 2), or the
     * header's state word (version 1 directories) */
    _Atomic uint64_t *retire_word;
    bool retire_v1;
    bool redo_commits;          /* version 5: a lazy commit writes only its redo
                                   lines (no record rewrite, no COMMITTED header),
                                   and a first 8-byte word record goes into the
                                   header line (nvh_lane_hdr.w0_*) */
    bool w0;                    /* this transaction's recs[0] is the header's
                                   inline record (no segment slot; rec NULL) */
    struct nvh_lane_hdr sh;     /* DRAM shadow of *hdr (this lane's owner only)  */
    unsigned index;
    _Atomic int owned;
    /* current transaction */
    uint64_t tid;               /* (tid_seq << 6) | index: unique per lane    */
    uint64_t tid_seq;           /* per lane, no shared counter: a LOCKed RMW
                                   would wait for this lane's pending CLWBs  */
    unsigned slot;              /* slot of the current / last transaction       */
    struct nvh_seg *seg;        /* segment being filled                         */
    uint32_t seg_nrec_cap;      /* seg's capacities (DRAM copies)               */
    uint32_t seg_data_cap;
    struct nvh_seg *head_seg[2];/* each slot's first segment, once validated    */
    uint32_t rec_next;          /* next record slot in seg                      */
    uint32_t data_next;         /* next data byte in seg                        */
    bool active_written;        /* state ACTIVE(tid) stored                     */
    bool unfenced;              /* flushed log lines not yet fenced             */
    uint32_t nt_lines;          /* non-temporal lines not yet in the statistics
                                   (counted at the next fence, nvh_txlog_nt_count_) */
    uint32_t wb_lines;          /* lines written back with nvh_txlog_wb_line_,
                                   likewise counted at the next fence          */
    nvh_recref *recs; size_t nrecs, recs_cap;
    nvh_win *wins; size_t nwins, wins_cap;   /* open write windows (above)  */
    uint64_t chain_bytes[2];    /* bytes of segments in each slot's chain       */
    /* statistics */
    uint64_t bytes_logged;      /* log bytes written (records + data)           */
    /* retirement: read by other lanes (help-flushing), written by the owner.
     * On a line of their own: every other field above is touched by the
     * owner only, and must not be invalidated by another thread's reads of
     * these (2-thread GUPS: one coherence miss per transaction, not three) */
    _Alignas(64) _Atomic int retire_pending; /* retirement stored and flushed,
                                                not fenced                   */
    /* one-fence word transactions (version 3): the last one's values were
     * stored in place and flushed after its fence, so they are durable only
     * at this lane's NEXT fence, and only then may it be retired. Until
     * then, and until its redo lines are overwritten, it is published here
     * by redo slot (pend_tid[s] != 0), so that another thread about to write
     * the same words can make them durable itself and retire it (record.c,
     * help_pending_pre). Seqlock per slot: pend_tid[s] is 0 while it changes. */
    struct nvh_pend {           /* line-aligned: writing one slot does not
                                   invalidate the other slot's lines */
        _Alignas(64) _Atomic uint64_t tid;
        _Atomic uint64_t cseq;  /* its commit order                             */
        _Atomic uint32_t n;
        _Atomic uint64_t off[NVH_REDO_MAX];
    } pend[2];
    /* Filters of the bytes this lane has ever logged or left pending, at
     * two resolutions: `wfine`, bit (offset >> 16) & 4095 (64 KiB granules
     * folded onto 4096 bits), and `wfilter`, bit (offset >> 20) & 255 (1 MiB
     * granules onto 256 bits), for transactions with more granules than a
     * short list holds. Set by the owner before the transaction's fence (so
     * before its pend entry or retirement can be seen), never cleared. A
     * fence or one-fence commit of another lane reads the pend entries and
     * retire flag only of lanes whose filter meets its own bytes: threads
     * working on disjoint data then share no line that changes per
     * transaction, even where their data lie in one 1 MiB granule (2-thread
     * GUPS scaling; record.c, filter_lanes). */
    _Alignas(64) _Atomic uint64_t wfilter[4];
    _Alignas(64) _Atomic uint64_t wfine[NVH_FILTER_FINE_WORDS];
    /* owner-only state of the one-fence path, on a line of its own */
    _Alignas(64) struct nvh_redo_line (*redo)[NVH_REDO_LINES]; /* [2] slots; NULL: version < 3 */
    unsigned redo_slot;         /* slot of the next one-fence transaction       */
    uint64_t redo_pend;         /* tid published in pend_tid (owner's copy)     */
    uint64_t hdr_pend;          /* a lazy in-place commit (nvh_txlog_commit_lazy)
                                   whose COMMITTED header is not retired yet  */
    unsigned pend_unflushed;    /* bit s: pend[s]'s words (an object commit's)
                                   are stored in place but not yet flushed by
                                   this lane: written back just before its
                                   next fence (record.c, flush_own_pending) */
    uint64_t tx_bits[4];        /* coarse filter bits of this transaction's records */
    uint16_t tx_fine[NVH_FILTER_TX_FINE]; /* its fine granules (wfine bit numbers) */
    unsigned tx_nfine;          /* how many; NVH_FILTER_TX_FINE + 1: too many, use tx_bits */
    uint64_t filter_meets;      /* fences/commits whose filter check found another
                                   lane (tests: the filter's precision)         */
    /* commit order of this lane (a Lamport clock, no shared counter): above
     * every commit of this lane and every commit of another lane this lane
     * helped (whose data it may overwrite); see docs/TX.md */
    uint64_t clock;
    uint64_t helped[NVH_TX_LANES]; /* highest tid of each lane this lane
                                      made durable and retired (skip those) */
} nvh_lane;

/* Per-pool state of the log and tx layers (registry, lane.c). */
typedef struct nvh_txlog {
    nvh_pool *pool;
    struct nvh_tx_dir *dir;     /* NULL until the first transaction             */
    pthread_mutex_t lock;       /* directory creation, lane assignment          */
    nvh_lane lanes[NVH_TX_LANES];
    _Atomic uint64_t next_tid;
    _Atomic uint64_t next_cseq;   /* after recovery: above every logged cseq   */
    _Atomic uint64_t lanes_used;  /* bit i: lane i was ever taken (never cleared) */
    _Atomic uint64_t limit;     /* bytes of segments per slot chain             */
    uint64_t gen;               /* registry generation                          */
    void *tx;                   /* the tx layer's state (orec table ...)        */
    void (*tx_free)(void *);
    uint64_t recovered_txs;     /* by the last open                             */
} nvh_txlog;

/* ==========================================================================
 * Internal API
 * ========================================================================== */
/* lane.c */
nvh_txlog *nvh_txlog_get(nvh_pool *pool);             /* NULL + error if none */
/* The registry's generation: changes whenever a pool's log state is
 * unregistered (close) or a thread's cached lane is given back to make room
 * for another pool's (lane.c, tls_fill). A thread's cached lane or
 * descriptor is valid while it is unchanged. */
extern _Atomic uint64_t nvh_txlog_reg_gen_;
static inline uint64_t nvh_txlog_gen_(void)
{
    return atomic_load_explicit(&nvh_txlog_reg_gen_, memory_order_acquire);
}
/* Attach lg to its pool (nvh_txlog_get finds it) / detach it (lane.c). */
int nvh_txlog_register_(nvh_pool *pool, nvh_txlog *lg);
void nvh_txlog_unregister_(nvh_txlog *lg);
/* A segment's data area, and the bytes of a lane's segment chain from head
 * (lane.c; used by record.c and recover.c). */
char *nvh_txlog_seg_data_(struct nvh_seg *s);
uint64_t nvh_txlog_chain_bytes_(nvh_txlog *lg, uint64_t head);
int nvh_txlog_dir_ensure(nvh_txlog *lg);              /* create the directory  */
nvh_lane *nvh_txlog_lane_acquire(nvh_txlog *lg);      /* a free lane for this thread */
nvh_lane *nvh_txlog_lane_get(nvh_pool *pool, nvh_txlog **lg_out); /* fast path    */
void nvh_txlog_lane_release(nvh_txlog *lg, nvh_lane *lane);
struct nvh_seg *nvh_txlog_seg_at(nvh_txlog *lg, uint64_t off);
/* Make room for a record (and `data` bytes of data) in the current slot
 * chain, growing it; sets lane->seg / rec_next / data_next. */
int nvh_txlog_room(nvh_txlog *lg, nvh_lane *lane, uint64_t data);

/* record.c */
uint32_t nvh_txrec_crc(const struct nvh_txrec *r, const void *old_data);
int nvh_txlog_begin(nvh_txlog *lg, nvh_lane *lane);   /* new tid, pick slot */
/* Append records; they are flushed, not fenced (lane->unfenced). */
int nvh_txlog_word(nvh_txlog *lg, nvh_lane *lane, uint64_t off, unsigned len);
/* n whole 8-byte words (offsets 8-aligned, inside the pool's data): the
 * records nvh_txlog_word(.., 8) would write, without its per-record checks
 * where one check covers them all (the in-place fast path, tx.c). */
int nvh_txlog_words(nvh_txlog *lg, nvh_lane *lane, const uint64_t *offs, unsigned n);
int nvh_txlog_range(nvh_txlog *lg, nvh_lane *lane, uint64_t off, uint64_t len,
                    const void *old_src);
int nvh_txlog_intent(nvh_txlog *lg, nvh_lane *lane, unsigned kind, uint64_t obj,
                     uint64_t len, nvh_recref *out);
/* Fence the records written so far, first helping the lanes in help_mask
 * (their pending one-fence transactions and retirements), or, with
 * NVH_TXLOG_HELP_MEETING, every lane whose filter meets this transaction's
 * records (record.c, filter_lanes). */
#define NVH_TXLOG_HELP_MEETING (~0ull)
void nvh_txlog_fence(nvh_txlog *lg, nvh_lane *lane, uint64_t help_mask);
/* nvh_txlog_words, then its FENCE 1 (helping the lanes the records meet),
 * in one call; on failure what was written is fenced too. */
int nvh_txlog_words_fenced(nvh_txlog *lg, nvh_lane *lane, const uint64_t *offs, unsigned n);
/* Commit: capture the new bytes from their places into the records (redo),
 * flush the data in place, write the commit record (with commit order cseq,
 * from the lane's clock), FENCE 2. */
int nvh_txlog_commit(nvh_txlog *lg, nvh_lane *lane, uint64_t cseq);
/* Room for what nvh_txlog_commit appends (a copy of the header's inline
 * record, when lane->w0), taken before the commit changes anything, so that
 * the commit itself cannot fail. The inline call is one load and a branch. */
int nvh_txlog_commit_reserve_(nvh_txlog *lg, nvh_lane *lane);
static inline int nvh_txlog_commit_reserve(nvh_txlog *lg, nvh_lane *lane)
{
    if (__builtin_expect(!lane->w0, 1) ||
        (lane->nrecs < lane->recs_cap && lane->rec_next < lane->seg_nrec_cap))
        return NVH_OK;
    return nvh_txlog_commit_reserve_(lg, lane);
}
/* The lazy in-place commit (docs/TX.md, "In-place transactions with lazy
 * data"): for a transaction whose records are at most NVH_REDO_MAX 8-byte
 * WORD records (nothing else) on a version 3+ directory. The new words go
 * into the records, the commit record and redo lines (all non-temporal),
 * FENCE 2, then the data are flushed, NOT fenced, and the transaction is
 * published as pending like a one-fence one: no data write-back and no
 * retirement on the commit path. Returns false (nothing done) if the
 * transaction does not qualify; the caller then uses nvh_txlog_commit. */
bool nvh_txlog_commit_lazy(nvh_txlog *lg, nvh_lane *lane, uint64_t cseq);
/* nvh_txlog_commit_lazy without its checks, for a caller that knows the
 * transaction qualifies and more (the in-place fast path, tx.c): every
 * record an 8-byte word, 1 to NVH_REDO_MAX of them, a version 5 directory
 * (lane->redo_commits), an unprotected pool. Cannot fail. */
void nvh_txlog_commit_lazy_words(nvh_txlog *lg, nvh_lane *lane, uint64_t cseq);
/* After commit or abort: state IDLE, flushed (not fenced); lane marked
 * retire-pending. */
void nvh_txlog_retire(nvh_txlog *lg, nvh_lane *lane);
/* Undo the current transaction in place (abort), reverse order. */
void nvh_txlog_undo(nvh_txlog *lg, nvh_lane *lane);
/* Help-flush the header lines of every lane in mask (except `self`) whose
 * retirement is pending; returns the lanes flushed. */
uint64_t nvh_txlog_help(nvh_txlog *lg, uint64_t mask, unsigned self);

/* Write windows held until the transaction ends (nvh_lane.wins). One load
 * and a branch when protection is off. */
int nvh_txlog_win_open_slow_(nvh_txlog *lg, nvh_lane *lane, const void *p, size_t len);
void nvh_txlog_win_close_all_(nvh_txlog *lg, nvh_lane *lane);
static inline bool nvh_txlog_protected_(const nvh_pool *pool)
{
    return __builtin_expect(atomic_load_explicit(&((nvh_pool *)pool)->protect,
                                                 memory_order_acquire) != NULL, 0);
}
static inline int nvh_txlog_win_open(nvh_txlog *lg, nvh_lane *lane, const void *p, size_t len)
{
    if (!nvh_txlog_protected_(lg->pool)) return NVH_OK;
    return nvh_txlog_win_open_slow_(lg, lane, p, len);
}
static inline void nvh_txlog_win_close_all(nvh_txlog *lg, nvh_lane *lane)
{
    if (__builtin_expect(lane->nwins != 0, 0)) nvh_txlog_win_close_all_(lg, lane);
}

/* nvh_txlog_room(lg, lane, 0) for a transaction's first record (lane->seg
 * NULL): the slot's first segment, validated earlier, taken without the
 * call when the pool is unprotected (no window to open); else the call. */
/* The lane's records go into segment n from its start. */
static inline void nvh_txlog_seg_set_(nvh_lane *lane, struct nvh_seg *n)
{
    lane->seg = n;
    lane->seg_nrec_cap = n->nrec_cap;
    lane->seg_data_cap = n->data_cap;
    lane->rec_next = 0;
    lane->data_next = 0;
}

static inline int nvh_txlog_room_first_(nvh_txlog *lg, nvh_lane *lane)
{
    struct nvh_seg *h = lane->head_seg[lane->slot];
    if (__builtin_expect(h != NULL && lane->seg == NULL, 1) && !nvh_txlog_protected_(lg->pool)) {
        nvh_txlog_seg_set_(lane, h);
        return NVH_OK;
    }
    return nvh_txlog_room(lg, lane, 0);
}

/* One-fence word transaction (lane->redo != NULL, nothing else logged in
 * this transaction, 1 <= n <= NVH_REDO_MAX, 8-byte aligned words): redo
 * lines with the commit order from the lane's clock (at least min_cseq: an
 * object write version), ONE fence (the commit point), then the values in
 * place (atomic word stores), flushed, not fenced (min_cseq != 0, an object
 * transaction: flushed just before the lane's next fence). */
int nvh_txlog_redo_commit(nvh_txlog *lg, nvh_lane *lane, const uint64_t *offs,
                          const uint64_t *vals, unsigned n, uint64_t min_cseq);
/* Make every pending one-fence transaction's data durable and retire it,
 * and every retirement durable (nvh_tx_quiesce, pool close): two fences. */
void nvh_txlog_quiesce_all(nvh_txlog *lg, nvh_lane *self);
uint32_t nvh_redo_line_crc(const struct nvh_redo_line *l);
/* test hook: recovery ignores redo lines (negative control of the tests) */
extern int nvh_txlog_test_no_redo_replay_;
/* test hooks: no help for other lanes' pending one-fence transactions; no
 * learning of their commit order */
extern int nvh_txlog_test_no_pending_help_, nvh_txlog_test_no_learn_;
/* test hook: one-fence commits do not publish their filter bits (negative
 * control: other lanes then skip their pending transactions) */
extern int nvh_txlog_test_no_filter_publish_;
/* test hooks (negative controls of test_tx_proto): lazy in-place commits
 * write no redo lines; one-fence commits do not retire the lazy commit
 * before them */
extern int nvh_txlog_test_no_lazy_redo_, nvh_txlog_test_no_hdr_retire_;
/* test hook: flush a one-fence object commit's words at its commit, not
 * before the lane's next fence (record.c, flush_own_pending) */
extern int nvh_txlog_test_flush_at_commit_;
/* test hooks (negative controls of the version-5 recovery rules): read an
 * ACTIVE header as uncommitted although redo lines of its tid are valid
 * (what a version-4 reader does); ignore valid redo lines of a later tid of
 * the lane. nvh_txlog_test_dir_version_: version of new directories (0:
 * NVH_TX_DIR_VERSION; 4 makes the library write a format-4 log). */
extern int nvh_txlog_test_v4_rules_, nvh_txlog_test_no_later_tid_, nvh_txlog_test_dir_version_;
/* test hooks: recovery ignores the header's inline word record; the full
 * commit does not append that word's redo record */
extern int nvh_txlog_test_no_w0_undo_, nvh_txlog_test_no_w0_append_;

/* recover.c */
int nvh_txlog_recover(nvh_txlog *lg);

/* Write one 64-byte log line (dst line-aligned) from a DRAM image and start
 * its write-back. In the pmem domain with CLWB/CLFLUSHOPT: non-temporal
 * stores, which need no read-for-ownership of a line a previous flush
 * evicted (on CPUs whose CLWB invalidates, re-writing a flushed line costs a
 * memory read) and no flush; the next nvh_drain (SFENCE) makes them durable.
 * Elsewhere: a copy and nvh_flush. Counted as one flushed line either way. */
static inline void nvh_txlog_line_(nvh_lane *lane, nvh_pool *pool, void *dst, const void *src)
{
    NVH_ASSERT(((uintptr_t)dst & (NVH_CACHELINE - 1)) == 0);
#if defined(__x86_64__)
    nvh_persist_ctx_ *ctx = NVH_CTX_(pool);
    if (ctx->domain == NVH_DOMAIN_PMEM && ctx->flush_kind != NVH_FLUSH_CLFLUSH) {
        /* four 16-byte non-temporal stores (SSE2, in every x86-64): 8
         * instructions a line where 8-byte MOVNTIs take about 35; every
         * aligned 8-byte word of it is still written whole */
        const __m128i *s = src;
        __m128i *d = dst;
        __m128i a = _mm_loadu_si128(s), b = _mm_loadu_si128(s + 1);
        __m128i c = _mm_loadu_si128(s + 2), e = _mm_loadu_si128(s + 3);
        _mm_stream_si128(d, a);
        _mm_stream_si128(d + 1, b);
        _mm_stream_si128(d + 2, c);
        _mm_stream_si128(d + 3, e);
        lane->nt_lines++;       /* into the statistics at the next fence */
        return;
    }
#endif
    (void)lane;
    memcpy(dst, src, NVH_CACHELINE);
    nvh_flush(pool, dst, NVH_CACHELINE);
}

/* The non-temporal lines written since the last fence, into the pool's
 * statistics (lines, NT bytes): once per fence rather than twice per line
 * (each count is a thread-stripe lookup and a load + store). Called just
 * before every fence of the log, which every line written precedes. */
static inline void nvh_txlog_nt_count_(nvh_pool *pool, nvh_lane *lane)
{
    uint32_t n = lane->nt_lines, wb = lane->wb_lines;
    if (!(n | wb)) return;
    lane->nt_lines = lane->wb_lines = 0;
    nvh_persist_ctx_ *ctx = NVH_CTX_(pool);
    nvh_stat_add_(ctx, NVH_STAT_LINES, (uint64_t)n + wb);
    nvh_stat_add_(ctx, NVH_STAT_NT_BYTES, (uint64_t)n * NVH_CACHELINE);
}

/* Start the write-back of the line holding p (a log line the caller stored
 * into with cached stores, e.g. the retire word), counted into the
 * statistics at the next fence as nvh_txlog_line_'s lines are: in the pmem
 * domain with CLWB one instruction, not nvh_flush's statistics stripe
 * lookup and domain switch. The next nvh_txlog_drain_ makes it durable. */
static inline void nvh_txlog_wb_line_(nvh_lane *lane, nvh_pool *pool, const void *p)
{
#if defined(__x86_64__)
    nvh_persist_ctx_ *ctx = NVH_CTX_(pool);
    if (__builtin_expect(ctx->domain == NVH_DOMAIN_PMEM && ctx->flush_kind == NVH_FLUSH_CLWB, 1)) {
        __asm__ volatile("clwb %0" : "+m"(*(volatile char *)p));
        lane->wb_lines++;
        return;
    }
#endif
    (void)lane;
    nvh_flush(pool, p, 1);
}

/* The log's fence: nvh_txlog_nt_count_ and nvh_drain, with one statistics
 * stripe lookup for the three counts in the common case (pmem domain,
 * CLWB/CLFLUSHOPT: an SFENCE). */
static inline void nvh_txlog_drain_(nvh_pool *pool, nvh_lane *lane)
{
#if defined(__x86_64__)
    nvh_persist_ctx_ *ctx = NVH_CTX_(pool);
    if (__builtin_expect(ctx->domain == NVH_DOMAIN_PMEM && ctx->flush_kind != NVH_FLUSH_CLFLUSH, 1)) {
        unsigned stripe = nvh_thread_stripe_;
        if (__builtin_expect(stripe == 0, 0)) stripe = nvh_assign_stripe_();
        _Atomic uint64_t *v = ctx->stats[stripe - 1].value;
        uint64_t n = lane->nt_lines, wb = lane->wb_lines;
        lane->nt_lines = lane->wb_lines = 0;
        atomic_store_explicit(&v[NVH_STAT_LINES],
                              atomic_load_explicit(&v[NVH_STAT_LINES], memory_order_relaxed) +
                                  n + wb,
                              memory_order_relaxed);
        atomic_store_explicit(&v[NVH_STAT_NT_BYTES],
                              atomic_load_explicit(&v[NVH_STAT_NT_BYTES], memory_order_relaxed) +
                                  n * NVH_CACHELINE,
                              memory_order_relaxed);
        atomic_store_explicit(&v[NVH_STAT_FENCES],
                              atomic_load_explicit(&v[NVH_STAT_FENCES], memory_order_relaxed) + 1,
                              memory_order_relaxed);
        __asm__ volatile("sfence" ::: "memory");
        return;
    }
#endif
    nvh_txlog_nt_count_(pool, lane);
    nvh_drain(pool);
}

#if defined(__x86_64__)
/* A record's fixed part (32 bytes: tid, off, len/kind/seq, old word),
 * unrolled: the general loop spends as much on the loop as on the four
 * crc32 instructions. Raw update, no inversion. */
__attribute__((target("sse4.2"))) static inline uint32_t
nvh_txlog_crc32b_sse42_(uint32_t crc, const unsigned char *p)
{
    uint64_t c = crc, w0, w1, w2, w3;
    memcpy(&w0, p, 8); memcpy(&w1, p + 8, 8); memcpy(&w2, p + 16, 8); memcpy(&w3, p + 24, 8);
    c = __builtin_ia32_crc32di(c, w0); c = __builtin_ia32_crc32di(c, w1);
    c = __builtin_ia32_crc32di(c, w2); c = __builtin_ia32_crc32di(c, w3);
    return (uint32_t)c;
}
#endif

/* CRC32C on the log's hot paths: nvh_crc32c's result, inlined
 * (src/common/crc32c.h). */
static inline uint32_t nvh_txlog_crc(uint32_t seed, const void *data, size_t len)
{
    return nvh_crc32c_inline(seed, data, len);
}

/* nvh_txrec_crc(r, NULL) inline: the checksum of a record without data
 * (WORD, ALLOC, FREE) */
static inline uint32_t nvh_txrec_crc_fixed_(const struct nvh_txrec *r)
{
#if defined(__x86_64__)
    int hw = atomic_load_explicit(&nvh_crc32c_hw_, memory_order_relaxed);
    if (__builtin_expect(hw > 0, 1))
        return ~nvh_txlog_crc32b_sse42_(~0u, (const unsigned char *)r) ^ 0x5a5a5a5au;
#endif
    return nvh_txlog_crc(0, r, 32) ^ 0x5a5a5a5au;
}

/* Prefetch a line for writing (PREFETCHW; executed as a NOP by x86 CPUs
 * that lack it). */
static inline void nvh_prefetchw_(const void *p)
{
#if defined(__x86_64__)
    __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 1, 3);
#endif
}

/* Point every lane at its header and retire word in directory d. */
static inline void nvh_txlog_dir_attach_(nvh_txlog *lg, struct nvh_tx_dir *d)
{
    for (unsigned i = 0; i < NVH_TX_LANES; i++) {
        nvh_lane *lane = &lg->lanes[i];
        lane->hdr = &d->lane[i];
        lane->retire_v1 = d->version == 1;
        lane->retire_word = lane->retire_v1 ? &d->lane[i].state : &d->retire[i].tid;
        lane->redo = d->version >= 3 ? d->redo[i] : NULL;
        lane->redo_commits = d->version >= 5;
        lane->head_seg[0] = lane->head_seg[1] = NULL;
    }
}

/* Allocator hooks used by the log (src/alloc API, public). */
static inline bool nvh_txlog_in_pool(const nvh_pool *pool, uint64_t off, uint64_t len)
{
    uint64_t size = nvh_pool_size(pool);
    return off >= NVH_PAGE && off < size && len <= size - off;
}

#endif /* NVH_LOG_H */
