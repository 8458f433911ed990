/* error.c — per-thread error code and message, and the static descriptions
 * of every nvh_error code. Every failing public call goes through nvh_fail so
 * that nvh_errcode()/nvh_errormsg() always describe the latest failure. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define NVH_ERRMSG_MAX 512

static _Thread_local int thread_errcode;
static _Thread_local char thread_errmsg[NVH_ERRMSG_MAX];

int nvh_errcode(void) { return thread_errcode; }
const char *nvh_errormsg(void) { return thread_errmsg; }

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
    int n = vsnprintf(thread_errmsg, sizeof thread_errmsg, fmt, ap);
    if (errno_value && n >= 0 && (size_t)n < sizeof thread_errmsg)
        snprintf(thread_errmsg + n, sizeof thread_errmsg - (size_t)n, ": %s",
                 strerror(errno_value));
    thread_errcode = code;
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
