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

/* Write the next superblock state slot (size, epoch, clean) durably, in a
 * write window. */
int nvh_pool_state_commit_(nvh_pool *pool, uint64_t size, uint64_t epoch, uint32_t clean);
/* Add NVH_STATE_* flags (format.h) to the superblock state: the next state
 * slot is written and flushed, and durable at the caller's next fence (a
 * crash before it leaves the previous slot current, without the flags).
 * The allocator marks the heap formatted with it. */
int nvh_superblock_set_flags(nvh_pool *pool, uint32_t flags);

/* Close the containers still open (internal.h, nvh_pool_hook): first ask
 * each whether it can close (a refusal sets *refused and leaves everything
 * as it was), then close them all. Returns the first error. */
int nvh_pool_close_containers_(nvh_pool *pool, bool *refused);

#endif /* NVH_POOL_H */
