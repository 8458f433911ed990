// test_cxx.cpp — a C++17 program uses nvheap through the shared library.
//
// Built with g++ -std=c++17 -Wall -Wextra -Wpedantic -Werror and linked
// against libnvheap.so (not the in-tree static library), so it proves three
// things: the header is clean C++; the inline fast paths (nvh_persist,
// nvh_memcpy_persist, ...) link, i.e. the internal symbols they call are
// exported; and C++ sees the same layout as the library (the per-thread
// statistics the inline code writes come back exact from nvh_stats_get,
// from several std::threads). Each persistence domain that runs on an
// ordinary file is exercised: process, msync (slow paths in the library)
// and pmem (flush instructions; large copies take the non-temporal path).
#include "layout.h"

#include <nvheap.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace {

int failures = 0;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            std::fprintf(stderr, "%s:%d: CHECK(%s) failed (nvh_errormsg: %s)\n",     \
                         __FILE__, __LINE__, #cond, nvh_errormsg());                 \
            failures++;                                                              \
        }                                                                            \
    } while (0)

struct node;
typedef NVH_RELPTR(struct node) node_ref;
struct node {
    node_ref next;
    uint64_t value;
};

constexpr size_t kBlob = 4096;
constexpr unsigned kThreads = 4;
constexpr unsigned kPersistsPerThread = 100;

// The application's record in the root area.
struct record {
    node_ref head;
    nvh_plock lock;
    uint64_t counter;
    alignas(64) unsigned char blob[kBlob];
    alignas(64) uint64_t lines[kThreads][8];    // one cache line per thread
};

void check_layout()
{
#define NVH_TEST_ITEM(e) static_cast<size_t>(e),
    const size_t cxx[] = { NVH_TEST_LAYOUT(NVH_TEST_ITEM) };
    CHECK(sizeof cxx / sizeof cxx[0] == nvh_test_c_layout_count);
    for (unsigned i = 0; i < nvh_test_c_layout_count && i < sizeof cxx / sizeof cxx[0]; i++) {
        if (cxx[i] != nvh_test_c_layout[i]) {
            std::fprintf(stderr, "layout item %u: C++ %zu, C %zu\n", i, cxx[i], nvh_test_c_layout[i]);
            failures++;
        }
    }
}

std::string scratch_path(const char *name)
{
    const char *dir = std::getenv("NVHEAP_TEST_DIR");
    if (!dir || !*dir) dir = "/tmp";
    std::string d(dir);
    mkdir(dir, 0700);   // the test's scratch directory; may exist
    std::string p = d + "/cxx-" + name + "-" + std::to_string(getpid()) + ".pool";
    unlink(p.c_str());
    return p;
}

nvh_stats stats_of(nvh_pool *pool)
{
    nvh_stats s;
    std::memset(&s, 0, sizeof s);
    nvh_stats_get(pool, &s);
    return s;
}

void run_domain(nvh_domain domain)
{
    const char *dname = nvh_domain_name(domain);
    std::fprintf(stderr, "-- domain %s\n", dname);
    const std::string path = scratch_path(dname);

    nvh_pool_options opts;
    std::memset(&opts, 0, sizeof opts);
    opts.root_size = 16384;
    nvh_pool *pool = nvh_pool_create_ex(path.c_str(), "cxx", uint64_t(8) << 20,
                                        static_cast<unsigned>(domain), &opts);
    CHECK(pool != nullptr);
    if (!pool) return;
    CHECK(nvh_pool_domain(pool) == domain);
    uint64_t root_size = 0;
    record *r = static_cast<record *>(nvh_root(pool, &root_size));
    CHECK(r != nullptr && root_size >= sizeof(record));
    CHECK(nvh_contains(pool, r, sizeof *r));

    // nvh_persist: one line, one fence, counted by the inline code.
    nvh_stats_reset(pool);
    r->counter = 41;
    nvh_persist(pool, &r->counter, sizeof r->counter);
    nvh_stats s = stats_of(pool);
    CHECK(s.lines_flushed == 1);
    CHECK(s.fences == 1);

    // memset/memcpy + persist: 4 KiB = 64 lines each; in the pmem domain
    // the copy is at least NVHEAP_NT_THRESHOLD (default 256) bytes and goes
    // through the library's non-temporal copy.
    unsigned char pattern[kBlob];
    for (size_t i = 0; i < kBlob; i++) pattern[i] = static_cast<unsigned char>(i * 7 + 1);
    nvh_stats_reset(pool);
    nvh_memset_persist(pool, r->blob, 0xAB, kBlob);
    nvh_memcpy_persist(pool, r->blob, pattern, kBlob);
    s = stats_of(pool);
    CHECK(s.lines_flushed == 2 * kBlob / NVH_CACHELINE);
    CHECK(s.fences == 2);
    if (domain == NVH_DOMAIN_PMEM && !std::getenv("NVHEAP_NT_THRESHOLD")) CHECK(s.nt_bytes == kBlob);
    if (domain == NVH_DOMAIN_MSYNC) CHECK(s.msyncs >= 1);

    // Allocate a node linked from the root, typed relative pointers.
    node *n = static_cast<node *>(nvh_alloc(pool, sizeof(node), nullptr, nullptr, &r->head.off));
    CHECK(n != nullptr);
    if (n) {
        CHECK(NVH_DEREF(pool, r->head) == n);
        NVH_SET(pool, n->next, static_cast<node *>(nullptr));
        n->value = 7;
        nvh_persist(pool, n, sizeof *n);
        CHECK(NVH_IS_NULL(n->next));
    }

    // Epoch lock and a transaction.
    CHECK(nvh_plock_acquire(pool, &r->lock) == NVH_OK);
    CHECK(nvh_plock_held(pool, &r->lock) == 1);
    CHECK(nvh_plock_release(pool, &r->lock) == NVH_OK);
    CHECK(nvh_tx_begin(pool) == NVH_OK);
    CHECK(nvh_tx_add_range(pool, &r->counter, sizeof r->counter) == NVH_OK);
    r->counter = 42;
    CHECK(nvh_tx_commit(pool) == NVH_OK);

    // Several threads: each gets its own statistics stripe (the TLS variable
    // the inline code reads), so the counts are exact.
    nvh_stats_reset(pool);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < kThreads; t++) {
        threads.emplace_back([pool, r, t] {
            for (unsigned i = 0; i < kPersistsPerThread; i++) {
                r->lines[t][0] = i;
                nvh_persist(pool, r->lines[t], sizeof r->lines[t]);
            }
        });
    }
    for (auto &th : threads) th.join();
    s = stats_of(pool);
    CHECK(s.lines_flushed == kThreads * kPersistsPerThread);
    CHECK(s.fences == kThreads * kPersistsPerThread);

    CHECK(nvh_pool_close(pool) == NVH_OK);

    // Everything persisted is there after a reopen.
    pool = nvh_pool_open(path.c_str(), "cxx", static_cast<unsigned>(domain));
    CHECK(pool != nullptr);
    if (pool) {
        r = static_cast<record *>(nvh_root(pool, nullptr));
        CHECK(r->counter == 42);
        CHECK(std::memcmp(r->blob, pattern, kBlob) == 0);
        const node *m = NVH_DEREF(pool, r->head);
        CHECK(m != nullptr && m->value == 7);
        for (unsigned t = 0; t < kThreads; t++) CHECK(r->lines[t][0] == kPersistsPerThread - 1);
        CHECK(nvh_plock_held(pool, &r->lock) == 0);
        CHECK(nvh_pool_close(pool) == NVH_OK);
    }
    unlink(path.c_str());
}

} // namespace

int main()
{
    check_layout();

    // Errors reach C++ code as codes and messages.
    const std::string missing = scratch_path("missing");
    CHECK(nvh_pool_open(missing.c_str(), "cxx", 0) == nullptr);
    CHECK(nvh_errcode() == NVH_E_NOENT);
    CHECK(std::strstr(nvh_errormsg(), missing.c_str()) != nullptr);

    run_domain(NVH_DOMAIN_PROCESS);
    run_domain(NVH_DOMAIN_MSYNC);
    run_domain(NVH_DOMAIN_PMEM);

    if (failures) std::fprintf(stderr, "test_cxx: %d check(s) failed\n", failures);
    else std::fprintf(stderr, "test_cxx: ok\n");
    return failures ? 1 : 0;
}
