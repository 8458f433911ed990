/* pool.h — what the pool layer offers the layers above it: the pool file's
 * primitives (create, open, close, write-back), the superblock's state
 * commit and flags, and the open-container registry's close pass.
 *
 * The public nvh_pool_create / nvh_pool_open / nvh_pool_close are not here:
 * they need the allocator and the transaction log, which sit above the
 * pool, so they live in src/lifecycle (the open/close sequence) and call
 * these primitives in order. A pool returned by nvh_pool_file_create_ or
 * nvh_pool_file_open_ is validated, locked and mapped, with its domain
 * attached (msync set, crash simulator), and nothing else: no heap, no
 * transaction log, its epoch not yet committed. */
#ifndef NVH_POOL_H
#define NVH_POOL_H

#include "../common/internal.h"

/* Create the file at path (O_EXCL), write its superblock (everything but
 * the magic, fsync, then the magic, fsync: a crash leaves no half pool),
 * map it. NULL with the error set if any step fails; the file is removed. */
nvh_pool *nvh_pool_file_create_(const char *path, const char *layout, uint64_t size,
                                unsigned flags, const nvh_pool_options *options);
/* Open, lock (shared if read-only), validate (pread only, so a bad file is
 * left untouched) and map the pool at path. NULL with the error set. */
nvh_pool *nvh_pool_file_open_(const char *path, const char *layout, unsigned flags);
/* Turn protection off, detach the domain, unmap, close the file (dropping
 * its lock) and free the handle. Writes nothing to the superblock: the
 * layers above must have quiesced, and the clean mark been committed (or
 * not, for a failed open). NULL is a no-op. */
void nvh_pool_file_close_(nvh_pool *pool);
/* At close, after the clean mark: the sim domain's write-back of the whole
 * pool, and NVH_E_IO if an msync failed while the pool was open. */
int nvh_pool_close_writeback_(nvh_pool *pool);

/* NVH_POOL_POPULATE: fault [addr, addr + len) of the mapping in now, 2 MiB
 * at a time (MADV_POPULATE_WRITE), in the domains that store straight to
 * the mapping; nothing otherwise. The allocator calls it for each chunk it
 * claims fresh. */
void nvh_pool_populate_(nvh_pool *pool, void *addr, uint64_t len);

/* Fault fresh pool memory a container is about to fill (a record slab, a
 * batch of nodes) in one madvise(MADV_POPULATE_WRITE) instead of a fault per
 * 4 KiB page, whatever the pool's flags. Contents are unchanged (the pages
 * are only mapped writable), so it is a hint: skipped in a protected pool
 * (its pages may be read-only on purpose), in a prefaulted one, and in the
 * domains where the mapping is not the media (sim) or where dirtying a page
 * costs a write-back (msync); errors are ignored. */
void nvh_pool_populate_fresh_(nvh_pool *pool, const void *addr, size_t len);

/* Write the next superblock state slot (size, epoch, clean) durably, in a
 * write window. */
int nvh_pool_state_commit_(nvh_pool *pool, uint64_t size, uint64_t epoch, uint32_t clean);
/* Add NVH_STATE_* flags (format.h) to the superblock state: the next state
 * slot is written and flushed, and durable at the caller's next fence (a
 * crash before it leaves the previous slot current, without the flags).
 * The allocator marks the heap formatted with it. */
int nvh_superblock_set_flags(nvh_pool *pool, uint32_t flags);

/* Close the containers still open (nvh_pool_hook, below): first ask
 * each whether it can close (a refusal sets *refused and leaves everything
 * as it was), then close them all. Returns the first error. */
int nvh_pool_close_containers_(nvh_pool *pool, bool *refused);

/* Open containers of a pool (src/pool/pool.c, docs/POOL.md "Open
 * containers"). The pool layer must not call up into the layers that build
 * on it, yet nvh_pool_close has to finish their work first: a container (a
 * B+ tree, a hash map) embeds a hook in its DRAM handle and registers it at
 * open; nvh_pool_close calls every registered hook's `close` before it
 * quiesces the lower layers. The registry also counts references, so that a
 * second open of the same container finds the first handle. */
struct nvh_pool_hook {
    nvh_pool_hook *next;           /* owned by pool.c                              */
    const void *key;               /* what is open: the container's root in the pool */
    unsigned refs;                 /* opens not closed yet (owned by pool.c)       */
    /* check_only: NVH_OK if close could run now, else the error it would
     * return (nothing changes). Otherwise make every completed operation
     * durable and free the handle, whatever refs says; it must not call
     * nvh_pool_hook_del_ (the hook is unregistered already). */
    int (*close)(nvh_pool_hook *hook, int check_only);
};
/* Register hook, unless a hook with the same key is registered: then that
 * one gets a reference more and is returned (hook is left alone). */
nvh_pool_hook *nvh_pool_hook_add_(nvh_pool *pool, nvh_pool_hook *hook);
/* The hook registered with key, with a reference more; NULL if none. */
nvh_pool_hook *nvh_pool_hook_get_(nvh_pool *pool, const void *key);
/* Drop a reference; at the last one the hook is unregistered. Returns the
 * references left (0: the caller closes the container now). */
unsigned nvh_pool_hook_del_(nvh_pool *pool, nvh_pool_hook *hook);

#endif /* NVH_POOL_H */
