/* lru.c — CLOCK over a chained hash table of keys (see lru.h).
 *
 * The hand walks the bucket array: a referenced entry loses its bit, an
 * unreferenced one is the victim. Items used since the hand last passed
 * survive one more round, which approximates LRU at one bit per item and
 * no list to maintain on every get. */
#include "lru.h"
#include "store.h"

#include <stdlib.h>
#include <string.h>

typedef struct lru_ent {
    struct lru_ent *next;
    uint64_t hash;
    uint64_t size;
    uint8_t ref;        /* set by lru_bump under concurrent readers: atomic */
    uint8_t klen;
    char key[];
} lru_ent;

struct nvc_lru {
    lru_ent **b;
    size_t nb;          /* a power of two */
    uint64_t count, bytes;
    size_t hand;
};

uint64_t lru_hash(const char *key, size_t klen)
{
    uint64_t h = 0xcbf29ce484222325ull;    /* FNV-1a, then a final mix */
    for (size_t i = 0; i < klen; i++)
        h = (h ^ (uint8_t)key[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

nvc_lru *lru_new(void)
{
    nvc_lru *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->nb = 1024;
    l->b = calloc(l->nb, sizeof *l->b);
    if (!l->b) {
        free(l);
        return NULL;
    }
    return l;
}

void lru_free(nvc_lru *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->nb; i++)
        for (lru_ent *e = l->b[i], *n; e; e = n) {
            n = e->next;
            free(e);
        }
    free(l->b);
    free(l);
}

static lru_ent **lru_slot(nvc_lru *l, const char *key, size_t klen, uint64_t h)
{
    lru_ent **p = &l->b[h & (l->nb - 1)];
    for (; *p; p = &(*p)->next)
        if ((*p)->hash == h && (*p)->klen == klen && memcmp((*p)->key, key, klen) == 0)
            break;
    return p;
}

static void lru_grow(nvc_lru *l)
{
    size_t nb = l->nb * 2;
    lru_ent **b = calloc(nb, sizeof *b);
    if (!b)
        return;            /* keep the longer chains: still correct */
    for (size_t i = 0; i < l->nb; i++)
        for (lru_ent *e = l->b[i], *n; e; e = n) {
            n = e->next;
            e->next = b[e->hash & (nb - 1)];
            b[e->hash & (nb - 1)] = e;
        }
    free(l->b);
    l->b = b;
    l->nb = nb;
    l->hand &= nb - 1;
}

int64_t lru_set(nvc_lru *l, const char *key, size_t klen, uint64_t size, bool cold)
{
    uint64_t h = lru_hash(key, klen);
    lru_ent **p = lru_slot(l, key, klen, h);
    if (*p) {
        int64_t old = (int64_t)(*p)->size;
        l->bytes = l->bytes - (*p)->size + size;
        (*p)->size = size;
        __atomic_store_n(&(*p)->ref, cold ? 0 : 1, __ATOMIC_RELAXED);
        return old;
    }
    lru_ent *e = malloc(sizeof *e + klen);
    if (!e)
        return -1;
    e->hash = h;
    e->size = size;
    e->ref = cold ? 0 : 1;
    e->klen = (uint8_t)klen;
    memcpy(e->key, key, klen);
    e->next = NULL;
    *p = e;
    l->count++;
    l->bytes += size;
    if (l->count > l->nb * 2)
        lru_grow(l);
    return 0;
}

bool lru_bump(nvc_lru *l, const char *key, size_t klen)
{
    lru_ent *e = *lru_slot(l, key, klen, lru_hash(key, klen));
    if (!e)
        return false;
    if (!__atomic_load_n(&e->ref, __ATOMIC_RELAXED))
        __atomic_store_n(&e->ref, 1, __ATOMIC_RELAXED);
    return true;
}

void lru_bump_hash(nvc_lru *l, uint64_t h)
{
    for (lru_ent *e = l->b[h & (l->nb - 1)]; e; e = e->next)
        if (e->hash == h && !__atomic_load_n(&e->ref, __ATOMIC_RELAXED))
            __atomic_store_n(&e->ref, 1, __ATOMIC_RELAXED);
}

bool lru_contains(nvc_lru *l, const char *key, size_t klen)
{
    return *lru_slot(l, key, klen, lru_hash(key, klen)) != NULL;
}

int64_t lru_size(nvc_lru *l, const char *key, size_t klen)
{
    lru_ent *e = *lru_slot(l, key, klen, lru_hash(key, klen));
    return e ? (int64_t)e->size : -1;
}

void lru_remove(nvc_lru *l, const char *key, size_t klen)
{
    lru_ent **p = lru_slot(l, key, klen, lru_hash(key, klen));
    lru_ent *e = *p;
    if (!e)
        return;
    *p = e->next;
    l->count--;
    l->bytes -= e->size;
    free(e);
}

int lru_victim(nvc_lru *l, char *key)
{
    if (l->count == 0)
        return -1;
    /* Two full turns clear every bit, so a victim is found within them. */
    for (size_t steps = 0; steps < 2 * l->nb + 1; steps++) {
        for (lru_ent *e = l->b[l->hand]; e; e = e->next) {
            if (__atomic_load_n(&e->ref, __ATOMIC_RELAXED)) {
                __atomic_store_n(&e->ref, 0, __ATOMIC_RELAXED);
                continue;
            }
            memcpy(key, e->key, e->klen);
            /* Move on: coming back to this bucket would find the entries
             * whose bit was just cleared and take them too. */
            l->hand = (l->hand + 1) & (l->nb - 1);
            return e->klen;
        }
        l->hand = (l->hand + 1) & (l->nb - 1);
    }
    return -1;
}

uint64_t lru_bytes(const nvc_lru *l) { return l->bytes; }
uint64_t lru_count(const nvc_lru *l) { return l->count; }
