/* error.c — per-thread error code and message, and the static descriptions
 * of every nvh_error code. Every failing public call goes through nvh_fail so
 * that nvh_errcode()/nvh_errormsg() always describe the latest failure. */
#include "internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The message buffer is allocated on a thread's first failure, not kept in
 * TLS: the library has initial-exec TLS (the persistence stripes and the
 * protection handler's state must be reachable without __tls_get_addr), and
 * such a library can be dlopen()ed only if its whole TLS block fits in
 * glibc's small static-TLS surplus (~1.6 KiB shared by every dlopen()ed
 * module). 512 B of message would use a third of it. A pthread key frees
 * the buffer when the thread exits. */
static _Thread_local int thread_errcode;
static _Thread_local char *thread_errmsg;

static pthread_key_t errmsg_key;
static pthread_once_t errmsg_once = PTHREAD_ONCE_INIT;

static void errmsg_key_create(void) { (void)pthread_key_create(&errmsg_key, free); }

/* This thread's buffer, or NULL when there is no memory for one. */
static char *errmsg_buffer(void)
{
    if (__builtin_expect(thread_errmsg != NULL, 1)) return thread_errmsg;
    pthread_once(&errmsg_once, errmsg_key_create);
    char *buf = malloc(NVH_ERRMSG_MAX);
    if (!buf) return NULL;
    buf[0] = '\0';
    thread_errmsg = buf;
    (void)pthread_setspecific(errmsg_key, buf);
    return buf;
}

int nvh_errcode(void) { return thread_errcode; }

const char *nvh_errormsg(void)
{
    if (thread_errmsg) return thread_errmsg;
    /* no failure yet on this thread, or no memory for its message */
    return thread_errcode == NVH_OK ? "" : nvh_strerror(thread_errcode);
}

const char *nvh_strerror(int code)
{
    switch ((nvh_error)code) {
    case NVH_OK: return "success";
    case NVH_E_INVAL: return "invalid argument";
    case NVH_E_NOENT: return "no such pool file";
    case NVH_E_EXISTS: return "file already exists";
    case NVH_E_BADMAGIC: return "not an nvheap pool (bad magic)";
    case NVH_E_LAYOUT: return "wrong layout";
    case NVH_E_VERSION: return "unsupported (newer) format version";
    case NVH_E_TRUNCATED: return "pool file is truncated";
    case NVH_E_CHECKSUM: return "checksum mismatch";
    case NVH_E_BUSY: return "pool is in use";
    case NVH_E_SIZE: return "size out of range";
    case NVH_E_READONLY: return "pool or file is read-only";
    case NVH_E_IO: return "I/O error";
    case NVH_E_NOMEM: return "out of memory";
    case NVH_E_NOSPACE: return "out of space";
    case NVH_E_CORRUPT: return "corrupt metadata";
    case NVH_E_NOTSUP: return "not supported";
    case NVH_E_BADPTR: return "invalid pointer";
    case NVH_E_DOUBLEFREE: return "double free";
    case NVH_E_NOTFOUND: return "not found";
    case NVH_E_TOOLONG: return "name or key too long";
    case NVH_E_ABORTED: return "transaction aborted";
    }
    return "unknown error";
}

static int fail_v(int code, int errno_value, const char *fmt, va_list ap)
{
    thread_errcode = code;
    char *msg = errmsg_buffer();
    if (!msg) return code;              /* nvh_errormsg falls back to nvh_strerror */
    /* Format into a local buffer first: an argument may be nvh_errormsg()
     * itself (quoting the failure being re-raised), which is `msg`, and
     * vsnprintf with overlapping source and destination is undefined. */
    char tmp[NVH_ERRMSG_MAX];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    if (errno_value && n >= 0 && (size_t)n < sizeof tmp)
        snprintf(tmp + n, sizeof tmp - (size_t)n, ": %s", strerror(errno_value));
    memcpy(msg, tmp, sizeof tmp);
    return code;
}

int nvh_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_v(code, 0, fmt, ap);
    va_end(ap);
    return code;
}

int nvh_fail_errno(int code, int errno_value, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_v(code, errno_value, fmt, ap);
    va_end(ap);
    return code;
}

int nvh_fail_context(int code, const char *fmt, ...)
{
    char ctx[NVH_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    nvh_err_saved s;
    nvh_err_save(&s);
    return nvh_fail(code, "%s: %s", ctx, s.msg);
}

void nvh_err_save(nvh_err_saved *s)
{
    s->code = nvh_errcode();
    snprintf(s->msg, sizeof s->msg, "%s", nvh_errormsg());
}

int nvh_err_restore(const nvh_err_saved *s)
{
    return nvh_fail(s->code, "%s", s->msg);
}
