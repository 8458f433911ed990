/* cap_prog.c — a program run with and without libnvheap-cap.so preloaded
 * (tests/cap/preload_test.sh): its output must be the same both ways.
 *
 *   cap_prog api                 the whole malloc family, printed results
 *   cap_prog threads             cross-thread alloc/free, a checksum
 *   cap_prog forkexec            children fork, check and scribble on their
 *                                copy of the heap, exec; the parent's heap
 *                                must be untouched
 *   cap_prog fds DIR             exec a clean copy of itself (no preload)
 *                                that fails if a descriptor names DIR
 *   cap_prog listfds DIR         (that copy)
 *   cap_prog double|interior|large-double|realloc-bad|xdouble   bad input
 *                                (xdouble: another thread frees a block
 *                                twice; found when the owner drains)
 *
 * Uses only libc: it links no nvheap code. */
#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void *free_twice(void *arg)
{
    void *volatile p = arg;   /* hides the double free from the compiler */
    free(malloc(16));         /* the thread's own heap */
    free(p);
    free(p);
    return NULL;
}

static uint64_t mix(uint64_t h, uint64_t v)
{
    return (h ^ v) * 1099511628211ull;
}

static int api(void)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t sz = 0; sz < ((size_t)8 << 20); sz = sz * 2 + 1) {
        unsigned char *p = malloc(sz);
        if (!p || malloc_usable_size(p) < sz)
            return printf("malloc %zu failed\n", sz), 1;
        memset(p, 0x5A, sz);
        unsigned char *c = calloc(1, sz);
        for (size_t i = 0; i < sz; i++)
            if (c[i])
                return printf("calloc %zu not zero\n", sz), 1;
        p = realloc(p, sz * 3 + 10);
        for (size_t i = 0; i < sz; i++)
            if (p[i] != 0x5A)
                return printf("realloc %zu lost bytes\n", sz), 1;
        h = mix(h, sz);
        free(p);
        free(c);
    }
    for (size_t a = 8; a <= ((size_t)1 << 20); a <<= 1) {
        void *p = NULL;
        if (posix_memalign(&p, a, 3 * a + 1) || (uintptr_t)p % a)
            return printf("posix_memalign %zu\n", a), 1;
        free(p);
        p = aligned_alloc(a, 4 * a);
        if (!p || (uintptr_t)p % a)
            return printf("aligned_alloc %zu\n", a), 1;
        free(p);
        p = memalign(a, 100);
        if (!p || (uintptr_t)p % a)
            return printf("memalign %zu\n", a), 1;
        free(p);
    }
    void *p = valloc(100);
    if ((uintptr_t)p % 4096)
        return printf("valloc\n"), 1;
    free(p);
    p = pvalloc(100);
    if ((uintptr_t)p % 4096 || malloc_usable_size(p) < 4096)
        return printf("pvalloc\n"), 1;
    free(p);
    errno = 0;
    volatile size_t huge = SIZE_MAX / 2;   /* volatile: a run-time overflow */
    if (reallocarray(NULL, huge, 3) || errno != ENOMEM)
        return printf("reallocarray overflow\n"), 1;
    if (calloc(huge, 3))
        return printf("calloc overflow\n"), 1;
    p = reallocarray(NULL, 10, 10);
    if (realloc(p, 0))   /* glibc: frees, returns NULL */
        return printf("realloc 0\n"), 1;
    if (posix_memalign(&p, 3, 10) != EINVAL)
        return printf("posix_memalign EINVAL\n"), 1;
    printf("api ok %llx\n", (unsigned long long)h);
    return 0;
}

/* ---- threads: one allocates, the others free ---------------------------- */
#define TQ 4096
static void *queue[TQ];
static pthread_mutex_t qlock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t sums[8];

static void *tworker(void *arg)
{
    uintptr_t id = (uintptr_t)arg;
    uint64_t x = id + 1, s = 0;
    for (int i = 0; i < 200000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        size_t sz = 8 + (x >> 33) % (i % 97 == 0 ? 300000 : 600);
        unsigned char *p = malloc(sz);
        p[0] = (unsigned char)sz;
        p[sz - 1] = (unsigned char)(sz >> 3);
        pthread_mutex_lock(&qlock);
        unsigned k = (unsigned)(x >> 40) % TQ;
        unsigned char *old = queue[k];
        queue[k] = p;
        pthread_mutex_unlock(&qlock);
        if (old) {
            size_t u = malloc_usable_size(old);
            s += u >= 8;
            free(old);
        }
    }
    sums[id] = s;
    return NULL;
}

static int threads(void)
{
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, tworker, (void *)i);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < TQ; i++)
        free(queue[i]);
    printf("threads ok %llu\n", (unsigned long long)(sums[0] + sums[1] + sums[2] + sums[3]));
    return 0;
}

/* ---- fork and exec ------------------------------------------------------- */
#define NB 64
static int forkexec(const char *self)
{
    unsigned char *buf[NB];
    for (int i = 0; i < NB; i++) {
        size_t sz = (size_t)(i + 1) * 3000;
        buf[i] = malloc(sz);
        memset(buf[i], i, sz);
    }
    for (int c = 0; c < 4; c++) {
        pid_t pid = fork();
        if (pid == 0) {
            /* the child sees the parent's heap, then scribbles on its copy */
            for (int i = 0; i < NB; i++) {
                size_t sz = (size_t)(i + 1) * 3000;
                for (size_t k = 0; k < sz; k += 511)
                    if (buf[i][k] != (unsigned char)i)
                        _exit(10);
                memset(buf[i], 0xEE, sz);
                free(buf[i]);
            }
            for (int i = 0; i < 1000; i++)
                memset(malloc(5000), 0xDD, 5000);
            char *argv[] = {(char *)self, "api", NULL};
            execve(self, argv, environ);
            _exit(11);
        }
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            return printf("child %d failed (%d)\n", c, st), 1;
    }
    /* allocating after the children ran must not hand out their blocks */
    for (int i = 0; i < NB; i++) {
        size_t sz = (size_t)(i + 1) * 3000;
        for (size_t k = 0; k < sz; k++)
            if (buf[i][k] != (unsigned char)i)
                return printf("parent heap changed by a child\n"), 1;
        free(buf[i]);
    }
    printf("forkexec ok\n");
    return 0;
}

/* ---- descriptors across exec --------------------------------------------- */
static int fds(const char *self, const char *dir)
{
    for (int i = 0; i < 1000; i++)
        free(malloc((size_t)i * 100));
    void *keep = malloc(1 << 20);
    (void)keep;
    /* the exec'd copy runs without the preload: any descriptor it has came
     * through the exec */
    char *envp[] = {"PATH=/usr/bin:/bin", NULL};
    char *argv[] = {(char *)self, "listfds", (char *)dir, NULL};
    execve(self, argv, envp);
    return 2;
}

static int listfds(const char *dir)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int bad = 0;
    while ((e = readdir(d))) {
        char path[300], target[4096];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0)
            continue;
        target[n] = 0;
        if (strncmp(target, dir, strlen(dir)) == 0) {
            printf("leaked descriptor %s -> %s\n", e->d_name, target);
            bad = 1;
        }
    }
    closedir(d);
    if (!bad)
        printf("fds ok\n");
    return bad;
}

/* offsets the compiler cannot see (it rejects a constant interior free) */
static volatile size_t off16 = 16, off32 = 32;
/* kept in a volatile: the compiler may not fold malloc/free pairs away */
static char *volatile sink;

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc < 2)
        return 2;
    const char *m = argv[1];
    if (!strcmp(m, "api"))
        return api();
    if (!strcmp(m, "threads"))
        return threads();
    if (!strcmp(m, "forkexec"))
        return forkexec(argv[0]);
    if (!strcmp(m, "fds") && argc > 2)
        return fds(argv[0], argv[2]);
    if (!strcmp(m, "listfds") && argc > 2)
        return listfds(argv[2]);
    if (!strcmp(m, "xdouble")) {
        sink = malloc(100);
        pthread_t t;
        pthread_create(&t, NULL, free_twice, sink);
        pthread_join(t, NULL);
        /* allocate until the class's page runs dry: its owner drains */
        for (int i = 0; i < 100000; i++)
            if (!malloc(100))
                return 3;
    } else if (!strcmp(m, "double")) {
        sink = malloc(100);
        free(sink);
        free(sink);
    } else if (!strcmp(m, "interior")) {
        sink = malloc(100);
        free(sink + off16);
    } else if (!strcmp(m, "large-double")) {
        sink = malloc(3 << 20);
        free(sink);
        free(sink);
    } else if (!strcmp(m, "realloc-bad")) {
        sink = malloc(200);
        if (realloc(sink + off32, 400))
            return 3;
    } else {
        return 2;
    }
    printf("survived\n");
    return 0;
}
