/* recover.c — open-time recovery of the transaction log.
 *
 * For every lane whose state is not IDLE, and (version 2 directories) whose
 * retire line does not name the state's tid: collect the records of its
 * transaction (same tid, consecutive seq, valid undo CRC, in chain order).
 *   COMMITTED with a valid commit CRC  -> redo: new bytes to their places,
 *                                         pending frees applied
 *   ACTIVE, version 5, with valid redo  -> committed lazily: not undone (its
 *   lines of its tid or a later one       own lines are replayed with the
 *                                         one-fence transactions)
 *   anything else                      -> undo: old bytes back, in reverse,
 *                                         objects the tx allocated freed
 * Version 5: a transaction's first record may be inline in the lane header
 * (w0_*, valid when its check names the header's tid); it is undone last.
 * Valid redo lines of a lane (one-fence and lazy commits) above its retire
 * word are replayed. A version-4 directory is recovered under version 4's
 * rules (an ACTIVE header is always undone) and then raised to version 5.
 * Redo runs in commit order across lanes, then undo in reverse tid order.
 * Then one fence, then every lane is set IDLE, then a second fence.
 *
 * Restartable: every step is idempotent. Redo and undo write the same bytes
 * again; a free intent is applied with the allocator's link update clearing
 * the record's link word in the same failure-atomic step, so it is applied
 * exactly once; freeing an allocation intent that is already free (or was
 * never activated) fails harmlessly. A crash anywhere in here leaves the lane
 * states untouched until everything is durable, so the next open starts over. */
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


typedef struct rtx {
    nvh_lane *lane;
    uint64_t tid, cseq;
    bool redo;
    nvh_recref *recs;
    size_t n, cap;
    /* version 5: the first record, inline in the lane header (undo only) */
    bool w0;
    uint64_t w0_off, w0_old;
    /* a one-fence word transaction (redo lines, version 3) */
    unsigned nw;
    uint64_t woff[NVH_REDO_MAX], wval[NVH_REDO_MAX];
} rtx;

int nvh_txlog_test_no_redo_replay_ = 0;
int nvh_txlog_test_v4_rules_ = 0;
int nvh_txlog_test_no_later_tid_ = 0;
int nvh_txlog_test_dir_version_ = 0;
int nvh_txlog_test_no_w0_undo_ = 0;

/* The committed one-fence transaction in slot `slot` of lane i, if any: every
 * line valid, same tid (of this lane), idx 0..nlines-1, words in the pool. */
static bool redo_slot_read(nvh_txlog *lg, unsigned i, unsigned slot, rtx *t)
{
    const struct nvh_redo_line *l = lg->dir->redo[i][slot];
    if (l[0].crc != nvh_redo_line_crc(&l[0])) return false;
    unsigned nl = l[0].nlines, nw = l[0].nwords;
    if ((l[0].tid & ((1u << NVH_TID_LANE_BITS) - 1)) != i || !l[0].tid || nl < 1 ||
        nl > NVH_REDO_LINES || nw < 1 || nw > NVH_REDO_MAX ||
        nl != (nw + NVH_REDO_WORDS_PER_LINE - 1) / NVH_REDO_WORDS_PER_LINE)
        return false;
    memset(t, 0, sizeof *t);
    t->tid = l[0].tid;
    t->cseq = l[0].cseq;
    for (unsigned k = 0; k < nl; k++) {
        if (l[k].crc != nvh_redo_line_crc(&l[k]) || l[k].tid != t->tid || l[k].idx != k ||
            l[k].nlines != nl || l[k].nwords != nw || l[k].cseq != t->cseq)
            return false;
        unsigned expect = nw - k * NVH_REDO_WORDS_PER_LINE;
        if (expect > NVH_REDO_WORDS_PER_LINE) expect = NVH_REDO_WORDS_PER_LINE;
        if (l[k].n != expect) return false;
        for (unsigned j = 0; j < l[k].n; j++) {
            uint64_t off = l[k].w[j][0];
            if ((off & 7) || !nvh_txlog_in_pool(lg->pool, off, 8)) return false;
            t->woff[t->nw] = off;
            t->wval[t->nw++] = l[k].w[j][1];
        }
    }
    t->redo = true;
    return true;
}

static int rtx_push(rtx *t, struct nvh_txrec *r, char *data)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        nvh_recref *g = realloc(t->recs, cap * sizeof *g);
        if (!g) return nvh_fail(NVH_E_NOMEM, "out of memory recovering transactions");
        t->recs = g;
        t->cap = cap;
    }
    t->recs[t->n++] = (nvh_recref){r, data, *r};
    return NVH_OK;
}

/* Is this record a plausible, intact member of transaction `tid`? */
static bool rec_ok(nvh_txlog *lg, struct nvh_seg *s, struct nvh_txrec *r, uint64_t tid,
                   uint16_t seq, char **data_out)
{
    if (r->tid != tid || r->seq != seq) return false;
    char *data = NULL;
    switch (r->kind) {
    case NVH_LR_WORD:
        if (r->len < 1 || r->len > 8) return false;
        break;
    case NVH_LR_RANGE: {
        uint64_t need = 2 * NVH_ALIGN_UP((uint64_t)r->len, (uint64_t)8);
        if (r->old_word > s->data_cap || need > s->data_cap - r->old_word) return false;
        data = nvh_txlog_seg_data_(s) + r->old_word;
        break;
    }
    case NVH_LR_ALLOC:
    case NVH_LR_FREE:
        break;
    default:
        return false;
    }
    if (r->crc != nvh_txrec_crc(r, data)) return false;
    if (r->kind <= NVH_LR_RANGE && !nvh_txlog_in_pool(lg->pool, r->off, r->len)) return false;
    *data_out = data;
    return true;
}

/* The segment at off of lane's chain, checked; NULL and NVH_E_CORRUPT (set)
 * if it is not one. A transaction in flight always has its first segment
 * (linked durably before its ACTIVE state), and a linked segment was
 * formatted before it was linked: so a missing or invalid one is damage,
 * and recovering without it would silently skip the rollback. */
static struct nvh_seg *seg_checked(nvh_txlog *lg, nvh_lane *lane, uint64_t off, const char *what)
{
    struct nvh_seg *s = nvh_txlog_seg_at(lg, off);
    if (s && s->check == nvh_seg_check(s)) return s;
    nvh_fail(NVH_E_CORRUPT, "%s: transaction log lane %u: %s at offset %llu is not a valid "
             "segment", lg->pool->path, lane->index, what, (unsigned long long)off);
    return NULL;
}

static int collect(nvh_txlog *lg, nvh_lane *lane, rtx *t, unsigned slot)
{
    uint16_t seq = 0;
    unsigned guard = 0;
    struct nvh_seg *s = seg_checked(lg, lane, lane->hdr->slot_head[slot],
                                    "the slot's first segment");
    while (s) {
        if (++guard > 1u << 20) return nvh_fail(NVH_E_CORRUPT, "transaction log chain loops");
        struct nvh_txrec *recs = (struct nvh_txrec *)((char *)s + 64);
        for (uint32_t i = 0; i < s->nrec_cap; i++) {
            char *data;
            if (!rec_ok(lg, s, &recs[i], t->tid, seq, &data)) break;
            int rc = rtx_push(t, &recs[i], data);
            if (rc != NVH_OK) return rc;
            seq++;
        }
        if (!s->next) return NVH_OK;
        s = seg_checked(lg, lane, s->next, "a linked segment");
    }
    return NVH_E_CORRUPT;
}

static bool commit_valid(nvh_txlog *lg, const rtx *t, const struct nvh_lane_hdr *h)
{
    (void)lg;
    if (h->nrecs > t->n) return false;
    uint64_t head[3] = {t->tid, h->nrecs, h->cseq};
    uint32_t c = nvh_txlog_crc(0, head, sizeof head);
    for (size_t i = 0; i < h->nrecs; i++) {
        const struct nvh_txrec *r = t->recs[i].rec;
        c = nvh_txlog_crc(c, &r->crc, sizeof r->crc);
        if (r->kind == NVH_LR_WORD) c = nvh_txlog_crc(c, &r->new_word, sizeof r->new_word);
        else if (r->kind == NVH_LR_RANGE)
            c = nvh_txlog_crc(c, t->recs[i].data + NVH_ALIGN_UP((uint64_t)r->len, (uint64_t)8), r->len);
    }
    return c == h->commit_crc;
}

/* Does [off, off+len) lie inside an object this committed tx freed? Such a
 * write must not be redone: the space may belong to someone else by now. */
static bool in_freed(const rtx *t, uint64_t off, uint64_t len)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct nvh_txrec *r = t->recs[i].rec;
        if (r->kind == NVH_LR_FREE && off >= r->off && off + len <= r->off + r->len) return true;
    }
    return false;
}

static void redo(nvh_txlog *lg, rtx *t)
{
    nvh_pool *pool = lg->pool;
    for (unsigned i = 0; i < t->nw; i++) {
        memcpy(pool->ctx.base + t->woff[i], &t->wval[i], 8);
        nvh_flush(pool, pool->ctx.base + t->woff[i], 8);
    }
    for (size_t i = 0; i < t->n; i++) {
        struct nvh_txrec *r = t->recs[i].rec;
        char *place = pool->ctx.base + r->off;
        if ((r->kind == NVH_LR_WORD || r->kind == NVH_LR_RANGE) && in_freed(t, r->off, r->len))
            continue;
        if (r->kind == NVH_LR_WORD) {
            memcpy(place, &r->new_word, r->len);
            nvh_flush(pool, place, r->len);
        } else if (r->kind == NVH_LR_RANGE) {
            memcpy(place, t->recs[i].data + NVH_ALIGN_UP((uint64_t)r->len, (uint64_t)8), r->len);
            nvh_flush(pool, place, r->len);
        }
    }
    /* make the redone bytes durable before frees change the allocator */
    nvh_drain(pool);
    for (size_t i = 0; i < t->n; i++) {
        struct nvh_txrec *r = t->recs[i].rec;
        if (r->kind != NVH_LR_FREE || r->link != r->off) continue;
        nvh_link l = {(nvh_off_t *)&r->link, 0};
        int rc = nvh_free(pool, nvh_ptr(pool, r->off), &l, 1);
        if (rc != NVH_OK) {
            /* already free (the free's link update was lost? impossible: it
             * is atomic with the free) or not an object: clear the intent */
            r->link = 0;
            nvh_persist(pool, &r->link, sizeof r->link);
        }
    }
}

static void undo(nvh_txlog *lg, rtx *t)
{
    nvh_pool *pool = lg->pool;
    for (size_t i = t->n; i-- > 0;) {
        struct nvh_txrec *r = t->recs[i].rec;
        char *place = pool->ctx.base + r->off;
        if (r->kind == NVH_LR_WORD) {
            memcpy(place, &r->old_word, r->len);
            nvh_flush(pool, place, r->len);
        } else if (r->kind == NVH_LR_RANGE) {
            memcpy(place, t->recs[i].data, r->len);
            nvh_flush(pool, place, r->len);
        }
    }
    if (t->w0) {                 /* the first record: undone last */
        memcpy(pool->ctx.base + t->w0_off, &t->w0_old, 8);
        nvh_flush(pool, pool->ctx.base + t->w0_off, 8);
    }
    nvh_drain(pool);
    for (size_t i = t->n; i-- > 0;) {
        struct nvh_txrec *r = t->recs[i].rec;
        if (r->kind != NVH_LR_ALLOC) continue;
        /* activated before the commit point that never came: free it. If it
         * was never activated (or a previous recovery freed it) this fails
         * with BADPTR/DOUBLEFREE and changes nothing. */
        if (nvh_usable_size(pool, nvh_ptr(pool, r->off)) != 0)
            (void)nvh_free(pool, nvh_ptr(pool, r->off), NULL, 0);
    }
}

static int cmp_redo(const void *a, const void *b)
{
    const rtx *x = a, *y = b;
    if (x->redo != y->redo) return x->redo ? -1 : 1;           /* redo first    */
    if (x->redo) return x->cseq < y->cseq ? -1 : x->cseq > y->cseq;  /* commit order */
    return x->tid > y->tid ? -1 : x->tid < y->tid;             /* undo: newest first */
}

int nvh_txlog_recover(nvh_txlog *lg)
{
    nvh_pool *pool = lg->pool;
    /* a walk rather than nvh_get_named: a pool without transactions must not
     * leave NVH_E_NOTFOUND as the thread's last error after a good open */
    if (!__atomic_load_n(&pool->heap, __ATOMIC_ACQUIRE)) return NVH_OK;  /* no heap yet:
                                     never format it just to look (lazy format) */
    void *ptr = NULL;
    size_t size = 0;
    int lrc = nvh_named_lookup_(pool, NVH_TX_DIR_NAME, &ptr, &size);
    if (lrc == NVH_E_CORRUPT) {    /* the directory may be lost: rollback would be skipped */
        char why[512];             /* nvh_fail formats into the buffer nvh_errormsg reads */
        snprintf(why, sizeof why, "%s", nvh_errormsg());
        return nvh_fail(NVH_E_CORRUPT, "%s: cannot find the transaction log directory: %s",
                        pool->path, why);
    }
    struct nvh_tx_dir *d = ptr;
    if (!d) return NVH_OK;                       /* no transaction ever ran */
    /* format 2..4 pools hold version-4 directories, format 5 pools version
     * 4 (until the first read-write open after an upgrade) or 5 */
    if (size < sizeof *d || d->magic != NVH_TX_DIR_MAGIC ||
        (d->version != NVH_TX_DIR_VERSION && d->version != NVH_TX_DIR_VERSION_V4) ||
        d->nlanes != NVH_TX_LANES)
        return nvh_fail(NVH_E_CORRUPT, "%s: the transaction log directory at offset %llu is "
                        "corrupt (magic, version %u or lane count)", pool->path,
                        (unsigned long long)nvh_off(pool, d), d->version);
    lg->dir = d;
    nvh_txlog_dir_attach_(lg, d);
    /* the meaning of an ACTIVE header depends on the version that wrote it */
    bool v5 = d->version >= 5 && !nvh_txlog_test_v4_rules_;
    uint64_t max_tid = 0, max_cseq = 0;
    /* per lane: the header's transaction and up to two one-fence ones (on
     * the heap: ~40 KiB) */
    rtx *txs = calloc(3 * NVH_TX_LANES, sizeof *txs);
    if (!txs) return nvh_fail(NVH_E_NOMEM, "out of memory recovering transactions");
    unsigned n = 0;
    int rc = NVH_OK;
    for (unsigned i = 0; i < NVH_TX_LANES; i++) {
        nvh_lane *lane = &lg->lanes[i];
        uint64_t w = atomic_load(&lane->hdr->state);
        uint64_t rw = atomic_load(lane->retire_word);
        /* a damaged state or retire word hides whether a transaction is in
         * flight (or was retired): report it, never guess */
        if (!NVH_LS_VALID(w) || !nvh_rw_valid(rw)) {
            bool st = !NVH_LS_VALID(w);
            rc = nvh_fail(NVH_E_CORRUPT, "%s: transaction log lane %u: the %s word at offset "
                          "%llu fails its check", pool->path, i, st ? "state" : "retire",
                          (unsigned long long)nvh_off(pool, st ? (void *)&lane->hdr->state
                                                               : (void *)lane->retire_word));
            goto out;
        }
        if (NVH_LS_TID(w) > max_tid) max_tid = NVH_LS_TID(w);
        uint64_t lane_max = NVH_LS_TID(w);
        uint64_t retired = nvh_rw_tid(rw);
        if (lane->hdr->cseq > max_cseq) max_cseq = lane->hdr->cseq;
        lane->redo_slot = 0;
        lane->redo_pend = 0;
        lane->hdr_pend = 0;
        atomic_store(&lane->pend[0].tid, 0);
        atomic_store(&lane->pend[1].tid, 0);
        memset(lane->helped, 0, sizeof lane->helped);
        uint64_t redo_max = 0;      /* newest tid with valid redo lines in the lane */
        bool redo_own = false;      /* valid redo lines of the header's tid */
        if (lane->redo) {
            /* version 3: one-fence transactions committed and not retired
             * (tids of a lane grow; the retire word holds the newest retired) */
            for (unsigned s = 0; s < 2; s++) {
                rtx *t = &txs[n];
                if (!redo_slot_read(lg, i, s, t)) continue;
                if (t->tid > redo_max) redo_max = t->tid;
                redo_own |= t->tid == NVH_LS_TID(w);
                if (t->tid > lane_max) lane_max = t->tid;
                if (t->cseq > max_cseq) max_cseq = t->cseq;
                if (t->tid <= retired || nvh_txlog_test_no_redo_replay_) continue;
                t->lane = lane;
                n++;
            }
        }
        if (retired > lane_max && (retired & ((1u << NVH_TID_LANE_BITS) - 1)) == i) lane_max = retired;
        if (lane_max > max_tid) max_tid = lane_max;
        /* skip the sequence number a crashed transaction may have used */
        lane->tid_seq = (lane_max >> NVH_TID_LANE_BITS) + 1;
        unsigned st = NVH_LS_ST(w);
        lane->slot = NVH_LS_SLOT(w);
        if (st == NVH_LS_IDLE) continue;
        /* version 2: retired by its retire line (a commit, or an abort whose
         * undo was durable before the retirement was stored); version 3: by
         * a retire word at or above its tid (one-fence transactions retire
         * later tids of the same lane) */
        if (!lane->retire_v1 && (lane->redo ? retired >= NVH_LS_TID(w)
                                            : retired == NVH_LS_TID(w)))
            continue;
        /* version 5: an ACTIVE transaction with valid redo lines of its tid
         * committed lazily (its lines, replayed above, are its commit
         * record); with valid lines of a later tid of the lane it had ended
         * before that transaction began — committed lazily, its data made
         * durable by the fence that preceded the later lines' overwriting
         * its own (an abort's retirement is durable before it returns, so
         * an aborted one was skipped above). Either way: not undone. */
        if (v5 && st == NVH_LS_ACTIVE &&
            (redo_own || (redo_max > NVH_LS_TID(w) && !nvh_txlog_test_no_later_tid_)))
            continue;
        rtx *t = &txs[n++];
        memset(t, 0, sizeof *t);
        t->lane = lane;
        t->tid = NVH_LS_TID(w);
        t->cseq = lane->hdr->cseq;
        if ((rc = collect(lg, lane, t, NVH_LS_SLOT(w))) != NVH_OK) goto out;
        const struct nvh_lane_hdr *h = lane->hdr;
        if (lane->redo_commits && !nvh_txlog_test_no_w0_undo_ &&
            h->w0_crc == nvh_w0_crc(t->tid, h->w0_off, h->w0_old) && !(h->w0_off & 7) &&
            nvh_txlog_in_pool(pool, h->w0_off, 8)) {
            t->w0 = true;
            t->w0_off = h->w0_off;
            t->w0_old = h->w0_old;
        }
        if (st == NVH_LS_COMMITTED && commit_valid(lg, t, lane->hdr)) {
            t->redo = true;
            t->n = lane->hdr->nrecs;
        }
    }
    qsort(txs, n, sizeof txs[0], cmp_redo);
    for (unsigned i = 0; i < n; i++) {
        if (txs[i].redo) redo(lg, &txs[i]);
        else undo(lg, &txs[i]);
    }
    if (n) nvh_drain(pool);
    for (unsigned i = 0; i < n; i++) {
        nvh_lane *lane = txs[i].lane;
        if (txs[i].nw) {
            /* a one-fence transaction: retired (the word only grows) */
            if (atomic_load(lane->retire_word) < nvh_rw_make(txs[i].tid))
                atomic_store(lane->retire_word, nvh_rw_make(txs[i].tid));
            nvh_flush(pool, (const void *)lane->retire_word, 8);
            continue;
        }
        atomic_store(&lane->hdr->state, NVH_LS_MAKE(txs[i].tid, NVH_LS_SLOT(atomic_load(&lane->hdr->state)),
                                                    NVH_LS_IDLE));
        nvh_flush(pool, lane->hdr, sizeof *lane->hdr);
    }
    if (n) nvh_drain(pool);
    lg->recovered_txs = n;
    if (d->version == NVH_TX_DIR_VERSION_V4) {
        /* Every lane is IDLE or retired now, and no redo line is above its
         * lane's retire word, so the log means the same under both versions'
         * rules: raise the version, durably, before the first transaction
         * writes the version-5 way (a crash before this fence recovers the
         * same log again under version 4's rules) */
        d->version = NVH_TX_DIR_VERSION;
        nvh_persist(pool, &d->version, sizeof d->version);
        nvh_txlog_dir_attach_(lg, d);
    }
out:
    for (unsigned i = 0; i < n; i++) free(txs[i].recs);
    free(txs);
    if (rc == NVH_OK) {
        for (unsigned i = 0; i < NVH_TX_LANES; i++) {
            nvh_lane *lane = &lg->lanes[i];
            memcpy(&lane->sh, lane->hdr, sizeof lane->sh);   /* the shadow starts here */
            lane->chain_bytes[0] = nvh_txlog_chain_bytes_(lg, lane->hdr->slot_head[0]);
            lane->chain_bytes[1] = nvh_txlog_chain_bytes_(lg, lane->hdr->slot_head[1]);
        }
        atomic_store(&lg->next_tid, max_tid + 1);
        atomic_store(&lg->next_cseq, max_cseq + 1);
    }
    return rc;
}
