/* test_kv_kill.c — a real crash: a child process puts keys in a loop (every
 * tenth operation an atomic batch of five puts) and acknowledges each
 * operation over a pipe once the call returned; the parent kills it with
 * SIGKILL at a random moment, reopens the store and checks that every
 * acknowledged operation is there with its value, that the batch in flight
 * (if any) is all or nothing, and that the store passes its check. */
#include "test_util.h"

#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <time.h>

#define BATCH_EVERY 10
#define BATCH_N 5

static size_t op_key(uint32_t i, unsigned j, char *k)
{
    if (i % BATCH_EVERY == BATCH_EVERY - 1) return (size_t)sprintf(k, "b%u-%u", i, j);
    return (size_t)sprintf(k, "k%u", i);
}

static size_t op_value(uint32_t i, unsigned j, char *v)
{
    size_t n = (size_t)sprintf(v, "value-%u-%u-", i, j);
    memset(v + n, 'x', i % 100);
    return n + i % 100;
}

static bool op_is_batch(uint32_t i) { return i % BATCH_EVERY == BATCH_EVERY - 1; }

static void child(const char *path, int fd, const char *engine)
{
    nvh_kv_config c = {.path = path, .name = "kill", .engine = engine,
                       .create = NVH_KV_CREATE_IF_MISSING, .size = 64 << 20};
    nvh_kv *kv = nvh_kv_open(&c);
    if (!kv) _exit(2);
    char k[64], v[256];
    for (uint32_t i = 0;; i++) {
        int rc;
        if (op_is_batch(i)) {
            nvh_kv_batch *b = nvh_kv_batch_new(kv);
            for (unsigned j = 0; j < BATCH_N; j++)
                nvh_kv_batch_put(b, k, op_key(i, j, k), v, op_value(i, j, v));
            rc = nvh_kv_batch_commit(b);
        } else {
            rc = nvh_kv_put(kv, k, op_key(i, 0, k), v, op_value(i, 0, v));
        }
        if (rc != NVH_OK) _exit(3);
        if (write(fd, &i, sizeof i) != sizeof i) _exit(4);
    }
}

static void kill_once(const char *engine, unsigned round)
{
    const char *path = test_path("kv-kill");
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        child(path, fds[1], engine);
    }
    close(fds[1]);
    /* let it run for 1000..3000 acknowledgements, then kill it */
    uint32_t want = 1000 + (uint32_t)((round * 7919u + (unsigned)time(NULL)) % 2000), ack, n = 0;
    int64_t last = -1;
    while (n < want && read(fds[0], &ack, sizeof ack) == sizeof ack) {
        last = ack;
        n++;
    }
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    while (read(fds[0], &ack, sizeof ack) == sizeof ack) last = ack;   /* written before death */
    close(fds[0]);
    if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL))
        fail_msg("child ended with status %d before the kill", status);
    assert_true(last >= 0);

    nvh_kv_config c = {.path = path, .name = "kill", .create = NVH_KV_OPEN_EXISTING};
    nvh_kv *kv = nvh_kv_open(&c);
    if (!kv) fail_msg("reopen: %s", nvh_errormsg());
    if (nvh_kv_check(kv) != NVH_OK) fail_msg("check: %s", nvh_errormsg());
    char k[64], v[256], buf[256];
    for (uint32_t i = 0; i <= (uint32_t)last; i++)
        for (unsigned j = 0; j < (op_is_batch(i) ? BATCH_N : 1u); j++) {
            size_t kl = op_key(i, j, k), vl = op_value(i, j, v), got = 0;
            int rc = nvh_kv_get_copy(kv, k, kl, buf, sizeof buf, &got);
            if (rc != NVH_OK || got != vl || memcmp(buf, v, vl))
                fail_msg("acknowledged op %u (key %s) lost after SIGKILL: rc %d", i, k, rc);
        }
    /* the operation in flight: a batch is all or nothing */
    uint32_t next = (uint32_t)last + 1;
    unsigned present = 0, total = op_is_batch(next) ? BATCH_N : 1;
    for (unsigned j = 0; j < total; j++)
        present += nvh_kv_exists(kv, k, op_key(next, j, k)) == 1;
    if (present != 0 && present != total)
        fail_msg("batch %u in flight: %u of %u puts visible", next, present, total);
    uint64_t count;
    assert_int_equal(nvh_kv_count_all(kv, &count), NVH_OK);
    uint64_t expect = 0;
    for (uint32_t i = 0; i <= (uint32_t)last; i++) expect += op_is_batch(i) ? BATCH_N : 1;
    assert_int_equal(count, expect + present);
    print_message("  %s: killed after %lld acknowledged operations; all there, in flight: "
                  "%u of %u\n", engine, (long long)last + 1, present, total);
    assert_int_equal(nvh_kv_close(kv), NVH_OK);
    unlink(path);
}

static void test_kill_hash(void **state)
{
    (void)state;
    for (unsigned r = 0; r < 3; r++) kill_once("hash", r);
}

int main(void)
{
    setenv("NVHEAP_DOMAIN", "process", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
