/* test_dlopen.c — libnvheap.so can be loaded at run time with dlopen(), as
 * language bindings (Python ctypes, JNI, ...) and plug-ins load it.
 *
 * The library uses initial-exec TLS (fast per-thread stripes and the
 * protection fault handler's state), which marks it STATIC_TLS: glibc then
 * has to place its whole TLS block in the small surplus it reserves for
 * dlopen()ed modules (~1.6 KiB in all). A thread-local array that grows the
 * block past it makes every dlopen() fail with "cannot allocate memory in
 * static TLS block" — this test catches that, and checks the loaded copy
 * works: create a pool, fail a call, read the message, close. dlclose()
 * leaves the library mapped (linked -z nodelete: its thread-exit
 * destructors and signal handler must outlive any dlclose). */
#include "test_util.h"

#include <dlfcn.h>

#ifndef NVHEAP_SHARED_LIBRARY
#error "NVHEAP_SHARED_LIBRARY must name the built libnvheap.so"
#endif

#define MiB ((uint64_t)1 << 20)

/* The static TLS block of the loaded module must stay inside the surplus,
 * leaving room for other dlopen()ed modules (glibc's surplus is shared).
 * The protection layer's per-thread window table sits behind a pointer
 * (src/protect/protect.h, pr_tls): the block is ~224 bytes today. */
#define TLS_BUDGET 512u

static void dlopen_and_use(void **state)
{
    (void)state;
    void *lib = dlopen(NVHEAP_SHARED_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!lib) fail_msg("dlopen(%s): %s", NVHEAP_SHARED_LIBRARY, dlerror());

    nvh_pool *(*create)(const char *, const char *, uint64_t, unsigned) =
        (nvh_pool * (*)(const char *, const char *, uint64_t, unsigned)) dlsym(lib, "nvh_pool_create");
    nvh_pool *(*open_pool)(const char *, const char *, unsigned) =
        (nvh_pool * (*)(const char *, const char *, unsigned)) dlsym(lib, "nvh_pool_open");
    int (*close_pool)(nvh_pool *) = (int (*)(nvh_pool *))dlsym(lib, "nvh_pool_close");
    int (*errcode)(void) = (int (*)(void))dlsym(lib, "nvh_errcode");
    const char *(*errormsg)(void) = (const char *(*)(void))dlsym(lib, "nvh_errormsg");
    assert_non_null(create);
    assert_non_null(open_pool);
    assert_non_null(close_pool);
    assert_non_null(errcode);
    assert_non_null(errormsg);

    const char *path = test_path("dlopen");
    nvh_pool *pool = create(path, "dl", 2 * MiB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(close_pool(pool), NVH_OK);
    assert_null(open_pool(path, "another-layout", NVH_DOMAIN_PROCESS));
    assert_int_equal(errcode(), NVH_E_LAYOUT);
    assert_non_null(strstr(errormsg(), path));
    unlink(path);
    dlclose(lib);
    /* still mapped: a thread that used it can exit safely afterwards */
    void *again = dlopen(NVHEAP_SHARED_LIBRARY, RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(again);
    dlclose(again);
}

/* The size of the module's TLS block, from its program headers. */
static void tls_block_is_small(void **state)
{
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "readelf -lW '%s' 2>/dev/null | awk '$1 == \"TLS\" { print $6 }'",
             NVHEAP_SHARED_LIBRARY);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[64] = "";
    char *got = fgets(line, sizeof line, p);
    pclose(p);
    if (!got || !*line) skip();                  /* no readelf: dlopen_and_use still ran */
    unsigned long memsz = strtoul(line, NULL, 16);
    if (memsz > TLS_BUDGET)
        fail_msg("libnvheap.so has %lu bytes of TLS (budget %u): move large thread-local "
                 "state behind a pointer", memsz, TLS_BUDGET);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dlopen_and_use),
        cmocka_unit_test(tls_block_is_small),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
