/* record.c — writing the log: word, range and allocator-intent records, the
 * commit record, retirement, abort-time undo, and help-flushing of other
 * lanes' retirements.
 *
 * The protocol (docs/TX.md):
 *   add      undo record (old bytes) + lane state ACTIVE(tid), flushed;
 *            FENCE 1 before the caller may store in place
 *   commit   new bytes captured into the records (redo), data flushed in
 *            place, commit record (state COMMITTED(tid) + CRC over the redo
 *            data) flushed; FENCE 2. The transaction is durable.
 *   retire   retire line := tid (version 1 directories: state IDLE(tid)),
 *            flushed, not fenced: it becomes durable at this
 *            lane's next fence, or at the next fence of any thread that
 *            touches the same data (help-flush), whichever comes first.
 * Recovery redoes a COMMITTED transaction whose commit CRC holds, and undoes
 * every other non-IDLE one. Because the lane's slots alternate, a retiring
 * transaction's records are never overwritten before its IDLE is durable.
 *
 * Words given as values (version 3) commit with ONE fence: redo lines, the
 * fence, then the values in place, flushed, not fenced (an object
 * transaction's: flushed before the lane's next fence, flush_own_pending;
 * section "One-fence
 * word transactions" below; docs/TX.md). */
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ==========================================================================
 * Checksums
 * ========================================================================== */
uint32_t nvh_txrec_crc(const struct nvh_txrec *r, const void *old_data)
{
    uint32_t c = nvh_txlog_crc(0, r, 32);
    if (r->kind == NVH_LR_RANGE && old_data) c = nvh_txlog_crc(c, old_data, r->len);
    return c ^ 0x5a5a5a5au;   /* an all-zero slot never checks */
}

static inline uint64_t alen8(uint64_t len) { return NVH_ALIGN_UP(len, (uint64_t)8); }

/* ==========================================================================
 * Write windows
 * ========================================================================== */
int nvh_txlog_win_open_slow_(nvh_txlog *lg, nvh_lane *lane, const void *p, size_t len)
{
    if (!len) return NVH_OK;
    /* only pool memory has windows (a lock word may live in DRAM) */
    if (!nvh_contains(lg->pool, p, len)) return NVH_OK;
    if (lane->nwins == lane->wins_cap) {
        size_t cap = lane->wins_cap ? lane->wins_cap * 2 : 16;
        nvh_win *g = realloc(lane->wins, cap * sizeof *g);
        if (!g) return nvh_fail(NVH_E_NOMEM, "out of memory for the transaction's write windows");
        lane->wins = g;
        lane->wins_cap = cap;
    }
    int rc = nvh_protect_open_(lg->pool, p, len);
    if (rc != NVH_OK) return rc;
    lane->wins[lane->nwins++] = (nvh_win){p, len};
    return NVH_OK;
}

void nvh_txlog_win_close_all_(nvh_txlog *lg, nvh_lane *lane)
{
    /* closing never fails for a window we opened; keep the thread's last
     * error as it was (a successful commit must not report one) */
    for (size_t i = lane->nwins; i-- > 0;) (void)nvh_protect_close_(lg->pool, lane->wins[i].p,
                                                                    lane->wins[i].len);
    lane->nwins = 0;
}

/* ==========================================================================
 * Begin and appending
 * ========================================================================== */
int nvh_txlog_begin(nvh_txlog *lg, nvh_lane *lane)
{
    (void)lg;
    lane->tid = 0;                    /* assigned by the first record */
    lane->seg = NULL;
    lane->seg_nrec_cap = lane->seg_data_cap = 0;
    lane->rec_next = lane->data_next = 0;
    lane->nrecs = 0;
    lane->active_written = false;
    lane->w0 = false;
    lane->unfenced = false;
    lane->tx_bits[0] = lane->tx_bits[1] = lane->tx_bits[2] = lane->tx_bits[3] = 0;
    lane->tx_nfine = 0;
    return NVH_OK;
}

/* First record of a transaction: publish ACTIVE(tid) in the other slot than
 * the one the header names now (whose records may still be needed). With
 * `inline_word` (version 5, an 8-byte word record) the header line is not
 * written here: the caller fills its w0_* fields and writes it. */
static int first_record(nvh_txlog *lg, nvh_lane *lane, bool inline_word)
{
    uint64_t w = atomic_load_explicit(&lane->sh.state, memory_order_relaxed);
    lane->slot = NVH_LS_SLOT(w) ^ 1u;
    /* tids are consumed only by transactions that log; every such
     * transaction makes its ACTIVE durable (add, commit or abort fence), so
     * only a crashed one can be ahead of the header, by one: recovery skips
     * one sequence number (recover.c) and a tid is never reused */
    lane->tid = (++lane->tid_seq << NVH_TID_LANE_BITS) | lane->index;
    lane->seg = NULL;
    lane->seg_nrec_cap = lane->seg_data_cap = 0;
    /* the header and retire lines are written until the transaction ends */
    int rc;
    if (nvh_txlog_protected_(lg->pool)) {
        rc = nvh_txlog_win_open(lg, lane, lane->hdr, sizeof *lane->hdr);
        if (rc == NVH_OK && !lane->retire_v1)
            rc = nvh_txlog_win_open(lg, lane, (const void *)lane->retire_word, sizeof(uint64_t));
        if (rc != NVH_OK) return rc;
    }
    rc = nvh_txlog_room_first_(lg, lane);
    if (rc != NVH_OK) return rc;
    atomic_store_explicit(&lane->sh.state, NVH_LS_MAKE(lane->tid, lane->slot, NVH_LS_ACTIVE),
                          memory_order_relaxed);
    lane->active_written = true;
    if (inline_word) return NVH_OK;
    /* no inline record: a previous transaction's w0 fields are bound to its
     * tid and never validate; offset 0 makes that obvious to a reader */
    lane->sh.w0_crc = 0;
    lane->sh.w0_off = 0;
    lane->sh.w0_old = 0;
    nvh_txlog_line_(lane, lg->pool, lane->hdr, &lane->sh);
    return NVH_OK;
}

static inline int push_ref(nvh_lane *lane, struct nvh_txrec *r, char *data)
{
    if (__builtin_expect(lane->nrecs == lane->recs_cap, 0)) {
        size_t cap = lane->recs_cap ? lane->recs_cap * 2 : 64;
        nvh_recref *g = realloc(lane->recs, cap * sizeof *g);
        if (!g) return nvh_fail(NVH_E_NOMEM, "out of memory for the transaction's records");
        lane->recs = g;
        lane->recs_cap = cap;
    }
    nvh_recref *ref = &lane->recs[lane->nrecs++];
    ref->rec = r;
    ref->data = data;
    return NVH_OK;
}

/* Reserve a record slot (and data) and fill the common fields. */
/* --------------------------------------------------------------------------
 * Lane filters (nvh_lane.wfilter, wfine; docs/TX.md "the lane filter").
 * A transaction is checked against other lanes by its fine granules when it
 * has at most NVH_FILTER_TX_FINE of them (one-fence commits always: at most
 * 8 words), else by its coarse bits. Both filters of a lane get every
 * granule it logs, so either check is sound.
 * -------------------------------------------------------------------------- */
static_assert(NVH_REDO_MAX <= NVH_FILTER_TX_FINE, "a one-fence commit's words fit the fine list");

static inline unsigned fine_granule(uint64_t off)
{
    return (unsigned)(off >> NVH_FILTER_FINE_SHIFT) & (NVH_FILTER_FINE_BITS - 1u);
}

static inline void fine_publish(nvh_lane *lane, unsigned g)
{
    uint64_t bit = 1ull << (g & 63u);
    if (!(atomic_load_explicit(&lane->wfine[g >> 6], memory_order_relaxed) & bit))
        atomic_fetch_or_explicit(&lane->wfine[g >> 6], bit, memory_order_seq_cst);
}

/* Publish this lane's coarse bits (rarely a store: only bits it never had). */
static inline void filter_publish(nvh_lane *lane, const uint64_t bits[4])
{
    for (unsigned w = 0; w < 4; w++)
        if (bits[w] & ~atomic_load_explicit(&lane->wfilter[w], memory_order_relaxed))
            atomic_fetch_or_explicit(&lane->wfilter[w], bits[w], memory_order_seq_cst);
}

/* The coarse filter bits and fine granules of n words, both published in
 * the lane's filters. */
static inline void filter_words(nvh_lane *lane, const uint64_t *offs, unsigned n, uint64_t bits[4],
                                uint16_t fine[])
{
    bool publish = !nvh_txlog_test_no_filter_publish_;
    bits[0] = bits[1] = bits[2] = bits[3] = 0;
    for (unsigned i = 0; i < n; i++) {
        unsigned g = (unsigned)(offs[i] >> 20) & 255u;
        uint64_t cbit = 1ull << (g & 63);
        bits[g >> 6] |= cbit;
        fine[i] = (uint16_t)fine_granule(offs[i]);
        if (publish) {
            /* filter_publish's effect, per word: only the words of the
             * filter these bits are in are read */
            if (!(atomic_load_explicit(&lane->wfilter[g >> 6], memory_order_relaxed) & cbit))
                atomic_fetch_or_explicit(&lane->wfilter[g >> 6], cbit, memory_order_seq_cst);
            fine_publish(lane, fine[i]);
        }
    }
}

/* The lanes of `mask` whose filter meets a transaction's bytes: only their
 * pending transactions and retirements can concern ours. `fine`/`nfine`:
 * its fine granules (nfine > NVH_FILTER_TX_FINE: too many, use `bits`). A
 * lane's bits are set before its fence, its pend entry after it, so a lane
 * whose filter misses our bytes has no visible pend entry with one of them. */
static inline uint64_t filter_lanes(nvh_txlog *lg, uint64_t mask, const uint64_t bits[4],
                                    const uint16_t *fine, unsigned nfine)
{
    uint64_t keep = 0;
    while (mask) {
        unsigned i = (unsigned)__builtin_ctzll(mask);
        mask &= mask - 1;
        const nvh_lane *o = &lg->lanes[i];
        if (nfine <= NVH_FILTER_TX_FINE) {
            for (unsigned k = 0; k < nfine; k++)
                if (atomic_load_explicit(&o->wfine[fine[k] >> 6], memory_order_acquire) &
                    (1ull << (fine[k] & 63u))) {
                    keep |= 1ull << i;
                    break;
                }
            continue;
        }
        for (unsigned w = 0; w < 4; w++)
            if (bits[w] & atomic_load_explicit(&o->wfilter[w], memory_order_acquire)) {
                keep |= 1ull << i;
                break;
            }
    }
    return keep;
}

/* Every record's bytes [off, off+len) go into the lane's filters (so that
 * other lanes' fences know this lane may have to be helped there) and into
 * this transaction's bits and fine list (so that its own fences help only
 * the lanes whose filters meet them). A range over more than 64 coarse
 * granules sets every coarse bit; over more fine granules than the filter
 * has bits, every fine bit. */
static inline void filter_record(nvh_lane *lane, uint64_t off, uint64_t len)
{
    uint64_t last = off + (len ? len : 1) - 1;
    bool publish = !nvh_txlog_test_no_filter_publish_;
    if (__builtin_expect(last >> NVH_FILTER_FINE_SHIFT == off >> NVH_FILTER_FINE_SHIFT, 1)) {
        /* one fine granule, hence one coarse one (a word record, most
         * ranges): the same bits as below without the loops */
        static_assert(NVH_FILTER_FINE_SHIFT <= 20, "fine granules nest in coarse ones");
        unsigned c = (unsigned)(off >> 20) & 255u;
        uint64_t cbit = 1ull << (c & 63u);
        lane->tx_bits[c >> 6] |= cbit;
        unsigned g = fine_granule(off);
        if (publish) {
            if (!(atomic_load_explicit(&lane->wfilter[c >> 6], memory_order_relaxed) & cbit))
                atomic_fetch_or_explicit(&lane->wfilter[c >> 6], cbit, memory_order_seq_cst);
            fine_publish(lane, g);
        }
        if (lane->tx_nfine > NVH_FILTER_TX_FINE) return;
        unsigned k = 0;
        while (k < lane->tx_nfine && lane->tx_fine[k] != g) k++;
        if (k < lane->tx_nfine) return;
        if (lane->tx_nfine == NVH_FILTER_TX_FINE) lane->tx_nfine++;   /* too many: coarse */
        else lane->tx_fine[lane->tx_nfine++] = (uint16_t)g;
        return;
    }
    uint64_t bits[4] = {0, 0, 0, 0};
    uint64_t g0 = off >> 20, g1 = last >> 20;
    if (g1 - g0 >= 64) {
        bits[0] = bits[1] = bits[2] = bits[3] = ~0ull;
    } else {
        for (uint64_t g = g0; g <= g1; g++) bits[(g & 255) >> 6] |= 1ull << (g & 63);
    }
    for (unsigned w = 0; w < 4; w++) lane->tx_bits[w] |= bits[w];
    if (publish) filter_publish(lane, bits);
    uint64_t f0 = off >> NVH_FILTER_FINE_SHIFT, f1 = last >> NVH_FILTER_FINE_SHIFT;
    if (f1 - f0 >= NVH_FILTER_FINE_BITS) f1 = f0 + NVH_FILTER_FINE_BITS - 1;
    for (uint64_t f = f0; f <= f1; f++) {
        unsigned g = (unsigned)f & (NVH_FILTER_FINE_BITS - 1u);
        if (publish) fine_publish(lane, g);
        if (lane->tx_nfine > NVH_FILTER_TX_FINE) continue;
        unsigned k = 0;
        while (k < lane->tx_nfine && lane->tx_fine[k] != g) k++;
        if (k < lane->tx_nfine) continue;
        if (lane->tx_nfine == NVH_FILTER_TX_FINE) lane->tx_nfine++;   /* too many: coarse */
        else lane->tx_fine[lane->tx_nfine++] = (uint16_t)g;
    }
}

/* filter_record(lane, off, 8) for an aligned word (one fine granule),
 * always in line: the word paths call it once per word. */
static inline __attribute__((always_inline)) void filter_word(nvh_lane *lane, uint64_t off)
{
    unsigned c = (unsigned)(off >> 20) & 255u;
    uint64_t cbit = 1ull << (c & 63u);
    lane->tx_bits[c >> 6] |= cbit;
    unsigned g = fine_granule(off);
    if (__builtin_expect(!nvh_txlog_test_no_filter_publish_, 1)) {
        if (!(atomic_load_explicit(&lane->wfilter[c >> 6], memory_order_relaxed) & cbit))
            atomic_fetch_or_explicit(&lane->wfilter[c >> 6], cbit, memory_order_seq_cst);
        fine_publish(lane, g);
    }
    unsigned nf = lane->tx_nfine;
    if (nf > NVH_FILTER_TX_FINE) return;
    for (unsigned k = 0; k < nf; k++)
        if (lane->tx_fine[k] == g) return;
    if (nf == NVH_FILTER_TX_FINE) lane->tx_nfine = nf + 1;      /* too many: coarse */
    else {
        lane->tx_fine[nf] = (uint16_t)g;
        lane->tx_nfine = nf + 1;
    }
}

static inline int new_record(nvh_txlog *lg, nvh_lane *lane, unsigned kind, uint64_t off,
                             uint64_t len, uint64_t data_bytes, nvh_recref **out, char **data_out)
{
    int rc;
    if (__builtin_expect(!lane->active_written, 0) && (rc = first_record(lg, lane, false)) != NVH_OK)
        return rc;
    /* the common case inline: room left in the current segment */
    if (__builtin_expect(lane->rec_next >= lane->seg_nrec_cap ||
                         lane->data_next + alen8(data_bytes) > lane->seg_data_cap, 0) &&
        (rc = nvh_txlog_room(lg, lane, data_bytes)) != NVH_OK)
        return rc;
    struct nvh_seg *s = lane->seg;
    struct nvh_txrec *r = (struct nvh_txrec *)((char *)s + 64) + lane->rec_next;
    char *data = NULL;
    uint64_t doff = lane->data_next;
    if (data_bytes) {
        data = nvh_txlog_seg_data_(s) + doff;
        lane->data_next += (uint32_t)alen8(data_bytes);
    }
    if ((rc = push_ref(lane, r, data)) != NVH_OK) return rc;
    filter_record(lane, off, len);
    lane->rec_next++;
    nvh_recref *ref = &lane->recs[lane->nrecs - 1];
    ref->sh = (struct nvh_txrec){
        .tid = lane->tid, .off = off, .len = (uint32_t)len, .kind = (uint16_t)kind,
        .seq = (uint16_t)(lane->nrecs - 1 - lane->w0), .old_word = data ? doff : 0,
    };
    *out = ref;
    if (data_out) *data_out = data;
    return NVH_OK;
}

/* Version 5: the transaction's first record, an 8-byte word, written into
 * the lane header's line with ACTIVE(tid): one line for both. */
static int word_inline(nvh_txlog *lg, nvh_lane *lane, uint64_t off)
{
    /* the DRAM entry first: first_record changes the header's shadow */
    int rc = push_ref(lane, NULL, NULL);
    if (rc != NVH_OK) return rc;
    if ((rc = first_record(lg, lane, true)) != NVH_OK) {
        lane->nrecs = 0;
        return rc;
    }
    filter_word(lane, off);
    lane->w0 = true;
    uint64_t old;
    memcpy(&old, NVH_CTX_(lg->pool)->base + off, 8);
    nvh_recref *ref = &lane->recs[0];
    ref->sh = (struct nvh_txrec){
        .tid = lane->tid, .off = off, .len = 8, .kind = NVH_LR_WORD, .old_word = old,
    };
    struct nvh_lane_hdr *h = &lane->sh;
    h->w0_off = off;
    h->w0_old = old;
    h->w0_crc = nvh_w0_crc(lane->tid, off, old);
    nvh_txlog_line_(lane, lg->pool, lane->hdr, h);
    lane->unfenced = true;
    lane->bytes_logged += sizeof *h;
    return NVH_OK;
}

int nvh_txlog_word(nvh_txlog *lg, nvh_lane *lane, uint64_t off, unsigned len)
{
    NVH_ASSERT(len >= 1 && len <= 8);
    if (!lane->active_written && len == 8 && lane->redo_commits && !(off & 7))
        return word_inline(lg, lane, off);
    nvh_recref *ref;
    int rc = new_record(lg, lane, NVH_LR_WORD, off, len, 0, &ref, NULL);
    if (rc != NVH_OK) return rc;
    struct nvh_txrec *r = &ref->sh;
    const char *place = NVH_CTX_(lg->pool)->base + off;
    uint64_t old = 0;
    if (len == 8) memcpy(&old, place, 8);     /* one load, no memcpy call */
    else memcpy(&old, place, len);
    r->old_word = old;
    r->crc = nvh_txrec_crc_fixed_(r);
    nvh_txlog_line_(lane, lg->pool, ref->rec, r);
    lane->unfenced = true;
    lane->bytes_logged += sizeof *r;
    return NVH_OK;
}

int nvh_txlog_words(nvh_txlog *lg, nvh_lane *lane, const uint64_t *offs, unsigned n)
{
    unsigned i = 0;
    int rc;
    if (!lane->active_written && lane->redo_commits) {
        if ((rc = word_inline(lg, lane, offs[0])) != NVH_OK) return rc;
        i = 1;
    }
    /* the rest: one room check for all (the DRAM entries, the segment's
     * record slots), else one call per word */
    if (!lane->active_written || lane->nrecs + (n - i) > lane->recs_cap ||
        lane->rec_next + (n - i) > lane->seg_nrec_cap) {
        for (; i < n; i++)
            if ((rc = nvh_txlog_word(lg, lane, offs[i], 8)) != NVH_OK) return rc;
        return NVH_OK;
    }
    if (i == n) return NVH_OK;
    nvh_pool *pool = lg->pool;
    const char *base = NVH_CTX_(pool)->base;
    struct nvh_txrec *slot = (struct nvh_txrec *)((char *)lane->seg + 64) + lane->rec_next;
    for (; i < n; i++, slot++) {
        uint64_t off = offs[i];
        filter_word(lane, off);
        uint64_t old;
        memcpy(&old, base + off, 8);
        nvh_recref *ref = &lane->recs[lane->nrecs];
        ref->rec = slot;
        ref->data = NULL;
        ref->sh = (struct nvh_txrec){
            .tid = lane->tid, .off = off, .len = 8, .kind = NVH_LR_WORD,
            .seq = (uint16_t)(lane->nrecs - lane->w0), .old_word = old,
        };
        ref->sh.crc = nvh_txrec_crc_fixed_(&ref->sh);
        nvh_txlog_line_(lane, pool, slot, &ref->sh);
        lane->nrecs++;
        lane->rec_next++;
        lane->bytes_logged += sizeof ref->sh;
    }
    lane->unfenced = true;
    return NVH_OK;
}

int nvh_txlog_range(nvh_txlog *lg, nvh_lane *lane, uint64_t off, uint64_t len, const void *old_src)
{
    if (len > UINT32_MAX / 2)
        return nvh_fail(NVH_E_SIZE, "range of %llu bytes is too large for one record",
                        (unsigned long long)len);
    nvh_recref *ref;
    char *data;
    int rc = new_record(lg, lane, NVH_LR_RANGE, off, len, 2 * alen8(len), &ref, &data);
    if (rc != NVH_OK) return rc;
    struct nvh_txrec *r = &ref->sh;
    /* old copy now; the new copy's space follows it and is filled at commit */
    nvh_memcpy_nodrain(lg->pool, data, old_src, len);
    r->crc = nvh_txrec_crc(r, old_src);
    nvh_txlog_line_(lane, lg->pool, ref->rec, r);
    lane->unfenced = true;
    lane->bytes_logged += sizeof *r + len;
    return NVH_OK;
}

int nvh_txlog_intent(nvh_txlog *lg, nvh_lane *lane, unsigned kind, uint64_t obj, uint64_t len,
                     nvh_recref *out)
{
    nvh_recref *ref;
    int rc = new_record(lg, lane, kind, obj, len, 0, &ref, NULL);
    if (rc != NVH_OK) return rc;
    struct nvh_txrec *r = &ref->sh;
    r->link = kind == NVH_LR_FREE ? obj : 0;
    r->crc = nvh_txrec_crc_fixed_(r);
    nvh_txlog_line_(lane, lg->pool, ref->rec, r);
    lane->unfenced = true;
    lane->bytes_logged += sizeof *r;
    if (out) *out = lane->recs[lane->nrecs - 1];
    return NVH_OK;
}

/* ==========================================================================
 * Fences and help-flushing
 * ========================================================================== */
uint64_t nvh_txlog_help(nvh_txlog *lg, uint64_t mask, unsigned self)
{
    mask &= atomic_load_explicit(&lg->lanes_used, memory_order_acquire);
    if (self < 64) mask &= ~(1ull << self);
    uint64_t flushed = 0;
    while (mask) {
        unsigned i = (unsigned)__builtin_ctzll(mask);
        mask &= mask - 1;
        if (!atomic_load_explicit(&lg->lanes[i].retire_pending, memory_order_acquire)) continue;
        /* CLWB writes the line back from whichever core holds it: the other
         * lane's IDLE store (ordered before its lock release or whatever
         * synchronisation made us touch its data) reaches the media with
         * our fence */
        nvh_flush(lg->pool, (void *)lg->lanes[i].retire_word, sizeof(uint64_t));
        flushed |= 1ull << i;
    }
    return flushed;
}

/* --------------------------------------------------------------------------
 * Pending one-fence transactions of other lanes (docs/TX.md, "One-fence word
 * transactions"). Lane A's one-fence transaction k stored its values in
 * place after its commit fence; they are durable at A's next fence, which
 * may never come (A idle), and k can be replayed until its redo lines are
 * overwritten (A's transaction after next) or A's retire word reaches it.
 * A thread B about to write one of k's words must not let a later
 * transaction of its own be retired while k can still be replayed over it.
 * So before its fence B flushes k's words (published in A's pend[slot];
 * CLWB writes back a line from whichever core holds it), and after the
 * fence, k's values being durable, retires k on A's behalf (the retire word
 * only grows: compare-and-swap to the max), flushed; B's next fence makes
 * that durable, before B retires or overwrites anything of its own. B also
 * takes its commit order above k's. With B's write set known (one-fence
 * commits) only transactions sharing a word with it are helped; otherwise
 * (undo and object transactions) every pending one is.
 * -------------------------------------------------------------------------- */
typedef struct help_todo {
    unsigned n;
    unsigned lane[2 * NVH_TX_LANES];
    uint64_t tid[2 * NVH_TX_LANES];
} help_todo;

int nvh_txlog_test_no_pending_help_ = 0;
int nvh_txlog_test_no_lazy_redo_ = 0;
int nvh_txlog_test_no_hdr_retire_ = 0;
int nvh_txlog_test_no_learn_ = 0;
int nvh_txlog_test_no_filter_publish_ = 0;

static inline bool shares_word(const _Atomic uint64_t *off, uint32_t n, const uint64_t *ws,
                               unsigned wn)
{
    for (uint32_t j = 0; j < n; j++) {
        uint64_t o = atomic_load_explicit(&off[j], memory_order_acquire);
        for (unsigned k = 0; k < wn; k++)
            if (ws[k] == o) return true;
    }
    return false;
}

/* ws/wn: the words the caller's transaction writes (NULL: unknown, help
 * every pending transaction) */
static void help_pending_pre(nvh_txlog *lg, nvh_lane *self, uint64_t mask, const uint64_t *ws,
                             unsigned wn, help_todo *todo)
{
    todo->n = 0;
    if (__builtin_expect(nvh_txlog_test_no_pending_help_, 0)) return;
    mask &= atomic_load_explicit(&lg->lanes_used, memory_order_acquire);
    if (self) mask &= ~(1ull << self->index);
    while (mask) {
        unsigned i = (unsigned)__builtin_ctzll(mask);
        mask &= mask - 1;
        nvh_lane *o = &lg->lanes[i];
        for (unsigned s = 0; s < 2; s++) {
            struct nvh_pend *p = &o->pend[s];
            uint64_t t1 = atomic_load_explicit(&p->tid, memory_order_acquire);
            if (!t1 || (self && self->helped[i] >= t1)) continue;
            uint32_t n = atomic_load_explicit(&p->n, memory_order_acquire);
            if (n > NVH_REDO_MAX) n = NVH_REDO_MAX;
            if (ws && !shares_word(p->off, n, ws, wn)) continue;
            if (self) {
                /* commit after it in recovery's order, should both be replayed */
                uint64_t c = atomic_load_explicit(&p->cseq, memory_order_acquire);
                if (c > self->clock && !nvh_txlog_test_no_learn_) self->clock = c;
            }
            for (uint32_t j = 0; j < n; j++) {
                uint64_t off = atomic_load_explicit(&p->off[j], memory_order_acquire);
                if (nvh_txlog_in_pool(lg->pool, off, 8))
                    nvh_flush(lg->pool, lg->pool->ctx.base + off, 8);
            }
            /* changed meanwhile: the slot was rewritten (k's lines are gone,
             * its values durable) or A retired it after a fence (its retire
             * line is flushed by nvh_txlog_help, called after this) */
            if (atomic_load_explicit(&p->tid, memory_order_acquire) != t1) continue;
            todo->lane[todo->n] = i;
            todo->tid[todo->n++] = t1;
        }
    }
}

static inline void retire_max_(nvh_pool *pool, _Atomic uint64_t *w, uint64_t tid)
{
    uint64_t rw = nvh_rw_make(tid);      /* monotonic in tid: compare encoded */
    uint64_t cur = atomic_load_explicit(w, memory_order_relaxed);
    if (cur >= rw) return;
    bool win = nvh_txlog_protected_(pool) && nvh_protect_open_(pool, (const void *)w, 8) == NVH_OK;
    while (cur < rw && !atomic_compare_exchange_weak_explicit(w, &cur, rw, memory_order_release,
                                                             memory_order_relaxed)) {}
    nvh_flush(pool, (const void *)w, 8);
    if (win) (void)nvh_protect_close_(pool, (const void *)w, 8);
}

static void help_pending_post(nvh_txlog *lg, nvh_lane *self, const help_todo *todo)
{
    for (unsigned k = 0; k < todo->n; k++) {
        retire_max_(lg->pool, lg->lanes[todo->lane[k]].retire_word, todo->tid[k]);
        if (self && self->helped[todo->lane[k]] < todo->tid[k])
            self->helped[todo->lane[k]] = todo->tid[k];
    }
}

/* After a fence of a logged (not one-fence) transaction of this lane: the
 * pending one-fence transaction's values are durable now; retire it before
 * that transaction changes anything, so that its own retirement is not the
 * only one covering k (recover.c: a later ACTIVE header hides it). Flushed,
 * not fenced: durable at this transaction's next fence, before which its
 * stores are undone at recovery anyway. */
static inline void retire_own_pending(nvh_txlog *lg, nvh_lane *lane)
{
    atomic_store_explicit(&lane->retire_pending, 1, memory_order_release);
    uint64_t cur = atomic_load_explicit(lane->retire_word, memory_order_relaxed);
    uint64_t rw = nvh_rw_make(lane->redo_pend);
    if (cur < rw && !nvh_txlog_protected_(lg->pool)) {
        /* a plain store, not retire_max_'s compare-and-swap (a LOCKed
         * instruction per transaction): helpers only ever raise this word
         * to the tid of a pending transaction of this lane, which is at
         * most redo_pend, and only from below (their CAS fails against a
         * higher value), so whichever order the stores land in, the word
         * ends at redo_pend */
        atomic_store_explicit(lane->retire_word, rw, memory_order_release);
        cur = rw;
    }
    if (cur < rw)                 /* protected pools: retire_max_ opens the window */
        retire_max_(lg->pool, lane->retire_word, lane->redo_pend);
    else
        nvh_txlog_wb_line_(lane, lg->pool, (const void *)lane->retire_word);
    /* after the retire store: a helper that sees 0 here flushes the retire
     * line (retire_pending) and so makes this store durable */
    atomic_store_explicit(&lane->pend[0].tid, 0, memory_order_release);
    atomic_store_explicit(&lane->pend[1].tid, 0, memory_order_release);
    lane->redo_pend = 0;
    lane->hdr_pend = 0;           /* at or below redo_pend: retired with it */
}

/* The words of this lane's committed one-fence object transactions are
 * stored in place after their fence but flushed only here, just before the
 * lane's next fence, which has to make them durable anyway (their redo
 * lines are overwritten only after it). Flushed at the commit instead, the
 * write-back is still in flight when the commit returns, and the thread's
 * next LOCKed instruction (the next object transaction's ownership-record
 * CAS) waits for it as for a fence: a second fence per transaction in all
 * but name (docs/TX.md, "One-fence object write sets"). Here the
 * write-backs drain under the one fence with the log lines.
 * nvh_txlog_test_flush_at_commit_: flush at the commit (test control). */
int nvh_txlog_test_flush_at_commit_ = 0;

/* Start the write-back of n aligned words of the pool (each in one line):
 * with CLWB in the pmem domain one instruction per word and one count for
 * all, not nvh_flush's per-call statistics and domain switch. */
static inline void flush_words(nvh_pool *pool, const _Atomic uint64_t *offs, uint32_t n)
{
    nvh_persist_ctx_ *ctx = NVH_CTX_(pool);
    char *base = ctx->base;
#if defined(__x86_64__)
    if (__builtin_expect(ctx->domain == NVH_DOMAIN_PMEM && ctx->flush_kind == NVH_FLUSH_CLWB, 1)) {
        for (uint32_t j = 0; j < n; j++) {
            char *w = base + atomic_load_explicit(&offs[j], memory_order_relaxed);
            __asm__ volatile("clwb %0" : "+m"(*(volatile char *)w));
        }
        nvh_stat_add_(ctx, NVH_STAT_LINES, n);
        return;
    }
#endif
    for (uint32_t j = 0; j < n; j++)
        nvh_flush(pool, base + atomic_load_explicit(&offs[j], memory_order_relaxed), 8);
}

static inline void flush_own_pending(nvh_txlog *lg, nvh_lane *lane)
{
    unsigned m = lane->pend_unflushed;
    if (__builtin_expect(!m, 1)) return;
    for (unsigned s = 0; s < 2; s++) {
        if (!(m & (1u << s))) continue;
        struct nvh_pend *p = &lane->pend[s];
        flush_words(lg->pool, p->off, atomic_load_explicit(&p->n, memory_order_relaxed));
    }
    lane->pend_unflushed = 0;
}

/* A commit's words, in place: flushed before the lane's next fence when
 * the thread is about to take ownership records (defer: an object
 * transaction's commit, whose thread CASes at its next object open), else
 * now — the write-back then overlaps the thread's work up to its next
 * fence, which no LOCKed instruction waits for on the word and in-place
 * paths. */
static inline void commit_flush(nvh_txlog *lg, nvh_lane *lane, unsigned slot, bool defer)
{
    lane->pend_unflushed |= 1u << slot;
    if (!defer || __builtin_expect(nvh_txlog_test_flush_at_commit_, 0))
        flush_own_pending(lg, lane);
}

/* nvh_txlog_fence, in line where the word paths call it with a constant
 * mask (the commit's FENCE 2: 0, nothing to help) */
static inline __attribute__((always_inline)) void fence_(nvh_txlog *lg, nvh_lane *lane,
                                                        uint64_t help_mask)
{
    help_todo todo;
    todo.n = 0;
    uint64_t others = atomic_load_explicit(&lg->lanes_used, memory_order_acquire) &
                      ~(1ull << lane->index);
    /* every lane that may have to be helped for this transaction's records,
     * i.e. whose filter meets their bytes (help_pending_pre) */
    if (help_mask == NVH_TXLOG_HELP_MEETING && others) {
        help_mask = filter_lanes(lg, others, lane->tx_bits, lane->tx_fine, lane->tx_nfine);
        lane->filter_meets += help_mask != 0;
    }
    /* other lanes to help (one load when this lane is the only one) */
    if (help_mask & others) {
        help_pending_pre(lg, lane, help_mask, NULL, 0, &todo);
        nvh_txlog_help(lg, help_mask, lane->index);    /* after: see there */
    }
    flush_own_pending(lg, lane);
    nvh_txlog_drain_(lg->pool, lane);
    if (todo.n) help_pending_post(lg, lane, &todo);
    /* the retire line was written back (and, on CPUs whose CLWB evicts,
     * dropped) by this fence: fetch it for writing now, so that the retire
     * store at the end of the transaction hits instead of stalling the
     * store buffer (and the next transaction's log stores behind it) on a
     * memory read */
    if (lane->active_written) nvh_prefetchw_((const void *)lane->retire_word);
    lane->unfenced = false;
    /* our own IDLE (flushed at retire) is durable now; a plain store, no
     * shared cache line written per transaction */
    if (atomic_load_explicit(&lane->retire_pending, memory_order_relaxed))
        atomic_store_explicit(&lane->retire_pending, 0, memory_order_relaxed);
    if (lane->redo_pend) retire_own_pending(lg, lane);
}

void nvh_txlog_fence(nvh_txlog *lg, nvh_lane *lane, uint64_t help_mask)
{
    fence_(lg, lane, help_mask);
}

int nvh_txlog_words_fenced(nvh_txlog *lg, nvh_lane *lane, const uint64_t *offs, unsigned n)
{
    size_t before = lane->nrecs;
    int rc = nvh_txlog_words(lg, lane, offs, n);
    /* on failure too, what was written is fenced: the caller's rollback
     * undoes from records it must find durable */
    if (__builtin_expect(rc == NVH_OK, 1) || lane->nrecs != before)
        fence_(lg, lane, NVH_TXLOG_HELP_MEETING);
    return rc;
}

/* ==========================================================================
 * Commit, retire, undo
 * ========================================================================== */
int nvh_txlog_test_no_w0_append_ = 0;

int nvh_txlog_commit_reserve_(nvh_txlog *lg, nvh_lane *lane)
{
    if (lane->nrecs == lane->recs_cap) {
        size_t cap = lane->recs_cap * 2;
        nvh_recref *g = realloc(lane->recs, cap * sizeof *g);
        if (!g) return nvh_fail(NVH_E_NOMEM, "out of memory for the transaction's records");
        lane->recs = g;
        lane->recs_cap = cap;
    }
    if (lane->rec_next >= lane->seg_nrec_cap) return nvh_txlog_room(lg, lane, 0);
    return NVH_OK;
}

int nvh_txlog_commit(nvh_txlog *lg, nvh_lane *lane, uint64_t cseq)
{
    nvh_pool *pool = lg->pool;
    struct nvh_lane_hdr *h = &lane->sh;
    if (lane->w0 && !nvh_txlog_test_no_w0_append_) {
        /* the header's inline record has no room for its new word: a copy
         * of it (same old word) becomes the last segment record, which
         * takes the new word below like any other. The header keeps the
         * inline record, so an undo still finds it whatever the crash
         * leaves of the COMMITTED line or the copy */
        nvh_recref *ref;
        int rc = new_record(lg, lane, NVH_LR_WORD, lane->recs[0].sh.off, 8, 0, &ref, NULL);
        if (rc != NVH_OK) return rc;
        ref->sh.old_word = lane->recs[0].sh.old_word;
        ref->sh.crc = nvh_txrec_crc_fixed_(&ref->sh);
        lane->bytes_logged += sizeof ref->sh;
    }
    size_t nseg = lane->nrecs - lane->w0;      /* records in segments */
    uint64_t head[3] = {lane->tid, nseg, cseq};
    uint32_t c = nvh_txlog_crc(0, head, sizeof head);
    for (size_t i = lane->w0; i < lane->nrecs; i++) {
        struct nvh_txrec *r = &lane->recs[i].sh;
        char *place = (char *)pool->ctx.base + r->off;
        c = nvh_txlog_crc(c, &r->crc, sizeof r->crc);
        if (r->kind == NVH_LR_WORD) {
            uint64_t nw = 0;
            if (r->len == 8) memcpy(&nw, place, 8);
            else memcpy(&nw, place, r->len);
            r->new_word = nw;
            nvh_txlog_line_(lane, pool, lane->recs[i].rec, r);
            nvh_flush(pool, place, r->len);
            c = nvh_txlog_crc(c, &nw, sizeof nw);
            lane->bytes_logged += 8;
        } else if (r->kind == NVH_LR_RANGE) {
            char *newc = lane->recs[i].data + alen8(r->len);
            nvh_memcpy_nodrain(pool, newc, place, r->len);
            nvh_flush(pool, place, r->len);
            c = nvh_txlog_crc(c, place, r->len);    /* == newc, without reading it back */
            lane->bytes_logged += r->len;
        }
    }
    h->nrecs = nseg;
    h->cseq = cseq;
    h->commit_crc = c;
    atomic_store_explicit(&h->state, NVH_LS_MAKE(lane->tid, lane->slot, NVH_LS_COMMITTED),
                          memory_order_relaxed);
    nvh_txlog_line_(lane, pool, lane->hdr, h);
    lane->bytes_logged += 64;
    nvh_txlog_fence(lg, lane, 0);      /* FENCE 2: the transaction is durable */
    return NVH_OK;
}

/* Publish a committed transaction whose values are in place and flushed
 * but not fenced as this lane's pending one in redo slot `slot` (seqlock:
 * tid 0 while the fields change; the release store orders the in-place
 * stores before it). */
static inline void pend_publish(nvh_lane *lane, unsigned slot, uint64_t tid, uint64_t cseq,
                                const uint64_t *offs, unsigned n)
{
    struct nvh_pend *p = &lane->pend[slot];
    atomic_store_explicit(&p->tid, 0, memory_order_relaxed);
    atomic_store_explicit(&p->cseq, cseq, memory_order_relaxed);
    atomic_store_explicit(&p->n, n, memory_order_relaxed);
    for (unsigned i = 0; i < n; i++) atomic_store_explicit(&p->off[i], offs[i], memory_order_relaxed);
    atomic_store_explicit(&p->tid, tid, memory_order_release);
    lane->redo_pend = tid;
    lane->redo_slot = slot ^ 1u;
}

static inline __attribute__((always_inline)) void
redo_lines_write(nvh_lane *lane, nvh_pool *pool, struct nvh_redo_line *dst, uint64_t tid,
                 uint64_t cseq, const uint64_t *offs, const uint64_t *vals, unsigned n);

/* Why this is safe (docs/TX.md): the undo records were durable before the
 * caller stored (FENCE 1). A crash before FENCE 2 completes finds either a
 * valid commit record (its CRC covers every record's new word: redo) or
 * none (undo, after any redo of the redo lines, which write the same
 * words: the undo wins). After FENCE 2 the commit record redoes it; once the
 * next transaction of this lane overwrites the header (before its FENCE 1,
 * which is also what makes these data durable), the redo lines, in the
 * redo slot the following one-fence or lazy commit does not use, still do.
 * They are overwritten only by the commit after next, after a fence that
 * made the data durable and this transaction retired (retire_own_pending,
 * or the one-fence commit's hdr_pend retirement). Other lanes find it in
 * pend[] exactly like a one-fence transaction. */
/* The end of a lazy commit, after its FENCE 2: publish it as pending, its
 * data written back (not fenced), the lane's transaction over. */
static inline __attribute__((always_inline)) void lazy_end_(nvh_txlog *lg, nvh_lane *lane,
                                                           unsigned slot, uint64_t cseq,
                                                           const uint64_t *offs, unsigned n)
{
    /* the data: flushed, not fenced (durable at this lane's next fence) */
    pend_publish(lane, slot, lane->tid, cseq, offs, n);
    commit_flush(lg, lane, slot, false);
    /* the retire line is stored next at this lane's next fence
     * (retire_own_pending), right after that fence; the commit's fence
     * (active_written) fetched it for writing, so that the store then hits
     * instead of holding the transaction's stores behind a memory read */
    lane->hdr_pend = lane->tid;
    /* no retirement now: the transaction is over for this lane */
    lane->active_written = false;
    lane->nrecs = 0;
}

/* Version 5: the redo lines alone are the commit record. The header keeps
 * ACTIVE(tid) and the records their old words; recovery reads an ACTIVE
 * header with valid redo lines of its tid (or of a later tid of the lane)
 * as committed (recover.c). The caller checked that every record is an
 * 8-byte word, 1 <= n <= NVH_REDO_MAX, and opened the lines' window. */
static inline __attribute__((always_inline)) void lazy_v5_(nvh_txlog *lg, nvh_lane *lane,
                                                          uint64_t cseq, unsigned n)
{
    nvh_pool *pool = lg->pool;
    unsigned slot = lane->redo_slot;
    struct nvh_redo_line *dst = lane->redo[slot];
    unsigned nlines = (n + NVH_REDO_WORDS_PER_LINE - 1) / NVH_REDO_WORDS_PER_LINE;
    uint64_t offs[NVH_REDO_MAX], vals[NVH_REDO_MAX];
    char *base = pool->ctx.base;
    for (unsigned i = 0; i < n; i++) {
        offs[i] = lane->recs[i].sh.off;
        memcpy(&vals[i], base + offs[i], 8);
    }
    if (__builtin_expect(!nvh_txlog_test_no_lazy_redo_, 1))
        redo_lines_write(lane, pool, dst, lane->tid, cseq, offs, vals, n);
    lane->bytes_logged += nlines * 64;
    fence_(lg, lane, 0);               /* FENCE 2: the transaction is durable */
    lazy_end_(lg, lane, slot, cseq, offs, n);
}

void nvh_txlog_commit_lazy_words(nvh_txlog *lg, nvh_lane *lane, uint64_t cseq)
{
    NVH_ASSERT(lane->redo_commits && lane->nrecs >= 1 && lane->nrecs <= NVH_REDO_MAX &&
               !nvh_txlog_protected_(lg->pool));
    lazy_v5_(lg, lane, cseq, (unsigned)lane->nrecs);
}

bool nvh_txlog_commit_lazy(nvh_txlog *lg, nvh_lane *lane, uint64_t cseq)
{
    nvh_pool *pool = lg->pool;
    size_t n = lane->nrecs;
    if (!lane->redo || n == 0 || n > NVH_REDO_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        const struct nvh_txrec *r = &lane->recs[i].sh;
        if (r->kind != NVH_LR_WORD || r->len != 8) return false;
    }
    unsigned slot = lane->redo_slot;
    struct nvh_redo_line *dst = lane->redo[slot];
    unsigned nlines = ((unsigned)n + NVH_REDO_WORDS_PER_LINE - 1) / NVH_REDO_WORDS_PER_LINE;
    if (nvh_txlog_protected_(pool) &&
        nvh_txlog_win_open(lg, lane, dst, nlines * sizeof *dst) != NVH_OK)
        return false;
    if (__builtin_expect(lane->redo_commits, 1)) {
        lazy_v5_(lg, lane, cseq, (unsigned)n);
        return true;
    }
    uint64_t offs[NVH_REDO_MAX], vals[NVH_REDO_MAX];
    struct nvh_lane_hdr *h = &lane->sh;
    /* version 4: the commit CRC's input in one buffer (nvh_txlog_commit's chain: tid,
     * count, cseq, then every record's crc and new word), one CRC call */
    unsigned char cin[24 + NVH_REDO_MAX * 12];
    uint64_t head[3] = {lane->tid, n, cseq};
    memcpy(cin, head, sizeof head);
    unsigned char *cp = cin + sizeof head;
    for (size_t i = 0; i < n; i++) {
        struct nvh_txrec *r = &lane->recs[i].sh;
        uint64_t nw;
        memcpy(&nw, (char *)pool->ctx.base + r->off, 8);
        r->new_word = nw;
        nvh_txlog_line_(lane, pool, lane->recs[i].rec, r);
        memcpy(cp, &r->crc, 4);
        memcpy(cp + 4, &nw, 8);
        cp += 12;
        offs[i] = r->off;
        vals[i] = nw;
    }
    uint32_t c = nvh_txlog_crc(0, cin, (size_t)(cp - cin));
    h->nrecs = n;
    h->cseq = cseq;
    h->commit_crc = c;
    atomic_store_explicit(&h->state, NVH_LS_MAKE(lane->tid, lane->slot, NVH_LS_COMMITTED),
                          memory_order_relaxed);
    nvh_txlog_line_(lane, pool, lane->hdr, h);
    if (!nvh_txlog_test_no_lazy_redo_)
        redo_lines_write(lane, pool, dst, lane->tid, cseq, offs, vals, (unsigned)n);
    lane->bytes_logged += (n + 1 + nlines) * 64;
    fence_(lg, lane, 0);               /* FENCE 2: the transaction is durable */
    lazy_end_(lg, lane, slot, cseq, offs, (unsigned)n);
    return true;
}

void nvh_txlog_retire(nvh_txlog *lg, nvh_lane *lane)
{
    if (!lane->active_written) return;
    /* pending first, then the IDLE store: helpers that see the flag
     * synchronised with this commit's end (lock release, user
     * synchronisation), so they also see the IDLE store they flush */
    atomic_store_explicit(&lane->retire_pending, 1, memory_order_relaxed);
    /* a plain store (then CLWB), not a non-temporal one: another lane's
     * help-flush (CLWB of this line) must be able to make it durable, and
     * an NT store may still sit in this core's write-combining buffer */
    if (lane->retire_v1) {
        uint64_t idle = NVH_LS_MAKE(lane->tid, lane->slot, NVH_LS_IDLE);
        atomic_store_explicit(&lane->sh.state, idle, memory_order_relaxed);
        atomic_store_explicit(lane->retire_word, idle, memory_order_release);
    } else {
        /* the header (and its shadow) keep ACTIVE/COMMITTED(tid): the
         * retire line naming the same tid overrides it (recover.c) */
        atomic_store_explicit(lane->retire_word, nvh_rw_make(lane->tid), memory_order_release);
    }
    nvh_flush(lg->pool, (void *)lane->retire_word, sizeof(uint64_t));
    lane->active_written = false;
    lane->nrecs = 0;
}

void nvh_txlog_undo(nvh_txlog *lg, nvh_lane *lane)
{
    nvh_pool *pool = lg->pool;
    for (size_t i = lane->nrecs; i-- > 0;) {
        struct nvh_txrec *r = &lane->recs[i].sh;
        char *place = (char *)pool->ctx.base + r->off;
        if (r->kind == NVH_LR_WORD) {
            memcpy(place, &r->old_word, r->len);
            nvh_flush(pool, place, r->len);
        } else if (r->kind == NVH_LR_RANGE) {
            memcpy(place, lane->recs[i].data, r->len);
            nvh_flush(pool, place, r->len);
        }
    }
    /* the restored bytes must be durable before the IDLE that disowns the
     * undo records */
    if (lane->active_written) nvh_txlog_fence(lg, lane, 0);
}

/* ==========================================================================
 * One-fence word transactions (version 3 directories)
 * ==========================================================================
 *   lines    ceil(n/2) redo lines {tid, cseq, (offset, new value) x 2, CRC},
 *            non-temporal, in the slot the previous one did not use
 *   FENCE    the only one: the transaction is durable (committed) here
 *   apply    values stored in place, flushed (an object transaction's:
 *            just before this lane's next fence, flush_own_pending), durable
 *            at this lane's next fence; published as pending (pend_*)
 * No retirement per transaction. Replaying a committed one-fence transaction
 * k is harmful only once one of its words was changed after it, and every
 * such change is covered:
 *   - this lane's next one-fence transaction: replayed after k (cseq);
 *   - this lane's next logged transaction u: its first fence made k's values
 *     durable and retires k (retire_own_pending), durable at u's next fence;
 *     until then u is ACTIVE, undone after every redo;
 *   - another lane's transaction: it helps first (help_pending_pre: makes
 *     k's words durable, then raises our retire word to k) and commits after
 *     k in the cseq order (it learned k's cseq);
 *   - a non-transactional store: only after nvh_tx_quiesce (documented).
 * A slot is rewritten only by the one-fence transaction after next, i.e.
 * after a fence that made its previous occupant's values durable: once k's
 * line is gone, k's values are durable and k is simply not replayed. */
uint32_t nvh_redo_line_crc(const struct nvh_redo_line *l)
{
    /* the whole line with the crc field as zero: one unrolled CRC of 64 B */
    struct nvh_redo_line c = *l;
    c.crc = 0;
    return nvh_txlog_crc(0, &c, sizeof c) ^ 0xa5a5a5a5u;
}

/* ceil(n/2) redo lines of transaction tid into dst, non-temporal. Each
 * line is built as eight words (little-endian x86: bytes 16..19 are n, idx,
 * nlines, nwords, 20..23 the CRC) and checksummed from them, not through a
 * zeroed struct filled byte by byte. */
static inline __attribute__((always_inline)) void
redo_lines_write(nvh_lane *lane, nvh_pool *pool, struct nvh_redo_line *dst, uint64_t tid,
                 uint64_t cseq, const uint64_t *offs, const uint64_t *vals, unsigned n)
{
    unsigned nlines = (n + NVH_REDO_WORDS_PER_LINE - 1) / NVH_REDO_WORDS_PER_LINE;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* bytes 16..19 of every line: n (of this line), idx, nlines, nwords */
    uint64_t counts = (uint64_t)nlines << 16 | (uint64_t)n << 24;
#endif
    for (unsigned l = 0; l < nlines; l++) {
        unsigned first = l * NVH_REDO_WORDS_PER_LINE;
        unsigned k = n - first < NVH_REDO_WORDS_PER_LINE ? n - first : NVH_REDO_WORDS_PER_LINE;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        static_assert(NVH_REDO_WORDS_PER_LINE == 2 && offsetof(struct nvh_redo_line, n) == 16 &&
                      offsetof(struct nvh_redo_line, crc) == 20 &&
                      offsetof(struct nvh_redo_line, reserved) == 56, "redo line as words");
        bool two = k > 1;
        uint64_t w[8] = {
            tid, cseq, counts | (uint64_t)k | (uint64_t)l << 8,
            offs[first], vals[first],
            two ? offs[first + 1] : 0, two ? vals[first + 1] : 0, 0,
        };
        /* nvh_redo_line_crc's value: computed with the crc field 0 */
        w[2] |= (uint64_t)(nvh_txlog_crc(0, w, sizeof w) ^ 0xa5a5a5a5u) << 32;
        nvh_txlog_line_(lane, pool, &dst[l], w);
#else
        struct nvh_redo_line line;
        memset(&line, 0, sizeof line);
        line.tid = tid;
        line.cseq = cseq;
        line.n = (uint8_t)k;
        line.idx = (uint8_t)l;
        line.nlines = (uint8_t)nlines;
        line.nwords = (uint8_t)n;
        for (unsigned j = 0; j < k; j++) {
            line.w[j][0] = offs[first + j];
            line.w[j][1] = vals[first + j];
        }
        line.crc = nvh_txlog_crc(0, &line, sizeof line) ^ 0xa5a5a5a5u;
        nvh_txlog_line_(lane, pool, &dst[l], &line);
#endif
    }
}

int nvh_txlog_redo_commit(nvh_txlog *lg, nvh_lane *lane, const uint64_t *offs,
                          const uint64_t *vals, unsigned n, uint64_t min_cseq)
{
    nvh_pool *pool = lg->pool;
    NVH_ASSERT(lane->redo && n >= 1 && n <= NVH_REDO_MAX && !lane->active_written);
    unsigned slot = lane->redo_slot;
    struct nvh_redo_line *dst = lane->redo[slot];
    unsigned nlines = (n + NVH_REDO_WORDS_PER_LINE - 1) / NVH_REDO_WORDS_PER_LINE;
    if (nvh_txlog_protected_(pool)) {
        int rc = nvh_txlog_win_open(lg, lane, dst, nlines * sizeof *dst);
        for (unsigned i = 0; i < n && rc == NVH_OK; i++)
            rc = nvh_txlog_win_open(lg, lane, pool->ctx.base + offs[i], 8);
        if (rc != NVH_OK) return rc;
    }
    uint64_t tid = (++lane->tid_seq << NVH_TID_LANE_BITS) | lane->index;
    /* other lanes' retirements and pending one-fence transactions: this
     * transaction's values may overwrite theirs (see help_pending_pre); the
     * commit order comes after theirs */
    help_todo todo;
    todo.n = 0;
    uint64_t bits[4];
    uint16_t fine[NVH_REDO_MAX];
    filter_words(lane, offs, n, bits, fine);
    uint64_t others = atomic_load_explicit(&lg->lanes_used, memory_order_acquire) &
                      ~(1ull << lane->index);
    if (others) {
        uint64_t meet = filter_lanes(lg, others, bits, fine, n);
        lane->filter_meets += meet != 0;
        help_pending_pre(lg, lane, meet, offs, n, &todo);
        nvh_txlog_help(lg, meet, lane->index);
    }
    /* above this lane's commits, those it helped (learned above) and, for
     * object writes, the write version their ownership records will carry */
    uint64_t cseq = lane->clock + 1;
    if (min_cseq > cseq) cseq = min_cseq;
    lane->clock = cseq;
    redo_lines_write(lane, pool, dst, tid, cseq, offs, vals, n);
    lane->bytes_logged += nlines * sizeof *dst;
    flush_own_pending(lg, lane);  /* the previous commits' words */
    nvh_txlog_drain_(pool, lane); /* THE fence: committed */
    if (todo.n) help_pending_post(lg, lane, &todo);
    if (atomic_load_explicit(&lane->retire_pending, memory_order_relaxed))
        atomic_store_explicit(&lane->retire_pending, 0, memory_order_relaxed);
    if (lane->hdr_pend && !nvh_txlog_test_no_hdr_retire_) {
        /* a lazy in-place commit's data are durable now: retire its commit
         * record (which no later one-fence commit overwrites) before the
         * commit after next overwrites its redo lines; flushed, durable at
         * this lane's next fence, which comes before that */
        atomic_store_explicit(&lane->retire_pending, 1, memory_order_release);
        retire_max_(pool, lane->retire_word, lane->hdr_pend);
        lane->hdr_pend = 0;
    }
    /* apply: flushed now (word transactions) or just before the next fence
     * of this lane (object transactions: flush_own_pending says why), and
     * durable at that fence.
     * Atomic word stores (a plain move): object readers of other threads
     * copy these words with atomic loads under their ownership record */
    char *base = pool->ctx.base;
    for (unsigned i = 0; i < n; i++)
        __atomic_store_n((uint64_t *)(void *)(base + offs[i]), vals[i], __ATOMIC_RELAXED);
    /* publish as pending in the slot's entry (its previous occupant's lines
     * are gone now) */
    pend_publish(lane, slot, tid, cseq, offs, n);
    commit_flush(lg, lane, slot, min_cseq != 0);
    lane->tid = tid;
    return NVH_OK;
}

void nvh_txlog_quiesce_all(nvh_txlog *lg, nvh_lane *self)
{
    (void)self;
    /* 1: every pending one-fence transaction's values (this thread's own
     * included), every retirement */
    help_todo todo;
    help_pending_pre(lg, NULL, ~0ull, NULL, 0, &todo);
    nvh_txlog_help(lg, ~0ull, NVH_TX_LANES);
    nvh_drain(lg->pool);
    /* 2: their retirements */
    if (todo.n) {
        help_pending_post(lg, NULL, &todo);
        nvh_drain(lg->pool);
    }
}
