/* _nvheap.c — the CPython extension nvheap._nvheap: the nvh_kv_* store as
 * Python objects (Store, Batch, Iterator) and the nvheap.Error family.
 *
 * Built on the limited API (Py_LIMITED_API 3.8, abi3): one binary serves
 * every CPython from 3.8 on. What that costs and how it is handled:
 *  - no buffer protocol before 3.11: a bytes key or value is used in place;
 *    any other bytes-like object (bytearray, memoryview, array, ...) is
 *    copied once into a bytes object (PyMemoryView_FromObject accepts exactly
 *    the objects that export a buffer, PyBytes_FromObject copies it). The
 *    copy also makes the bytes immutable while the GIL is released.
 *  - no METH_FASTCALL before 3.10: methods take a tuple; the hot paths
 *    (store[key], key in store, store[key] = v) are type slots, which pay no
 *    argument parsing at all.
 *
 * Threads. Reads (get, in, len, iteration) hold the GIL: they never wait
 * (readers of the store never block) and are shorter than a GIL handoff.
 * Writes (put, delete, batch commit) release it, because each flushes and
 * fences before it returns. A write in flight counts in store->busy; close()
 * first marks the store closed (later calls raise) and then waits, GIL
 * released, until busy is 0, so nvh_kv_close never runs under a write.
 *
 * Iterators and batches hold a reference to their store and sit on its
 * list of children; closing the store frees their C objects first (an
 * iterator then ends, a batch raises), since nvh_kv_close must be the last
 * call on the handle.
 *
 * Callbacks (nvh_kv_get, nvh_kv_get_all) run inside the store's read
 * section, where the store must not be called again. They only create
 * bytes objects and append to a list: neither allocates a GC-tracked
 * object, so no collection, finalizer or other Python code can run there. */
#define Py_LIMITED_API 0x03080000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <nvheap.h>
#include <string.h>
#include <time.h>

/* ---- errors --------------------------------------------------------------- */

/* One exception class per NVH_E_* code, all subclasses of nvheap.Error. */
typedef struct err_def {
    int code;
    const char *code_name;     /* "NVH_E_TOOLONG"                              */
    const char *class_name;    /* "TooLongError"                               */
    int extra_base;            /* 1: also a KeyError, 2: also a ValueError     */
} err_def;

static const err_def err_defs[] = {
    {NVH_E_INVAL, "NVH_E_INVAL", "InvalidError", 2},
    {NVH_E_NOENT, "NVH_E_NOENT", "NoEntError", 0},
    {NVH_E_EXISTS, "NVH_E_EXISTS", "ExistsError", 0},
    {NVH_E_BADMAGIC, "NVH_E_BADMAGIC", "BadMagicError", 0},
    {NVH_E_LAYOUT, "NVH_E_LAYOUT", "LayoutError", 0},
    {NVH_E_VERSION, "NVH_E_VERSION", "VersionError", 0},
    {NVH_E_TRUNCATED, "NVH_E_TRUNCATED", "TruncatedError", 0},
    {NVH_E_CHECKSUM, "NVH_E_CHECKSUM", "ChecksumError", 0},
    {NVH_E_BUSY, "NVH_E_BUSY", "BusyError", 0},
    {NVH_E_SIZE, "NVH_E_SIZE", "SizeError", 0},
    {NVH_E_READONLY, "NVH_E_READONLY", "ReadOnlyError", 0},
    {NVH_E_IO, "NVH_E_IO", "IoError", 0},
    {NVH_E_NOMEM, "NVH_E_NOMEM", "NoMemError", 0},
    {NVH_E_NOSPACE, "NVH_E_NOSPACE", "NoSpaceError", 0},
    {NVH_E_CORRUPT, "NVH_E_CORRUPT", "CorruptError", 0},
    {NVH_E_NOTSUP, "NVH_E_NOTSUP", "NotSupportedError", 0},
    {NVH_E_BADPTR, "NVH_E_BADPTR", "BadPtrError", 0},
    {NVH_E_DOUBLEFREE, "NVH_E_DOUBLEFREE", "DoubleFreeError", 0},
    {NVH_E_NOTFOUND, "NVH_E_NOTFOUND", "NotFoundError", 1},
    {NVH_E_TOOLONG, "NVH_E_TOOLONG", "TooLongError", 2},
    {NVH_E_ABORTED, "NVH_E_ABORTED", "AbortedError", 0},
};
#define N_ERRS (sizeof err_defs / sizeof err_defs[0])

static PyObject *Error;              /* nvheap.Error                           */
static PyObject *err_classes[N_ERRS];

static const err_def *err_find(int code)
{
    for (size_t i = 0; i < N_ERRS; i++)
        if (err_defs[i].code == code) return &err_defs[i];
    return NULL;
}

/* Raise the class of `code` with args (arg,) — arg is the message, or the
 * key for a KeyError from store[key] — and set .code, .name, .message. */
static PyObject *raise_code_arg(int code, const char *message, PyObject *arg)
{
    const err_def *d = err_find(code);
    PyObject *cls = Error;
    if (d) cls = err_classes[d - err_defs];
    PyObject *msg = PyUnicode_DecodeUTF8(message, (Py_ssize_t)strlen(message), "replace");
    if (!msg) return NULL;
    PyObject *inst = PyObject_CallFunctionObjArgs(cls, arg ? arg : msg, NULL);
    if (!inst) {
        Py_DECREF(msg);
        return NULL;
    }
    PyObject *code_obj = PyLong_FromLong(code);
    PyObject *name_obj = PyUnicode_FromString(d ? d->code_name : "NVH_E_UNKNOWN");
    if (code_obj && name_obj && PyObject_SetAttrString(inst, "code", code_obj) == 0 &&
        PyObject_SetAttrString(inst, "name", name_obj) == 0 &&
        PyObject_SetAttrString(inst, "message", msg) == 0)
        PyErr_SetObject(cls, inst);
    Py_XDECREF(code_obj);
    Py_XDECREF(name_obj);
    Py_DECREF(msg);
    Py_DECREF(inst);
    return NULL;
}

/* Raise for the failure the calling thread just had in the library (its
 * thread-local nvh_errormsg() still describes rc). */
static PyObject *raise_nvh(int rc)
{
    const char *m = nvh_errcode() == rc ? nvh_errormsg() : "";
    if (!m[0]) m = nvh_strerror(rc);
    return raise_code_arg(rc, m, NULL);
}

/* Raise an nvheap error the binding itself detects (closed store, ...). */
static PyObject *raise_local(int code, const char *message)
{
    return raise_code_arg(code, message, NULL);
}

/* ---- bytes-like arguments ------------------------------------------------- */

typedef struct bview {
    const char *p;
    Py_ssize_t n;
    PyObject *owned;      /* a bytes copy we hold, or NULL */
} bview;

static int bview_get(PyObject *o, bview *v, const char *what)
{
    char *p;
    v->owned = NULL;
    if (PyBytes_Check(o)) {
        if (PyBytes_AsStringAndSize(o, &p, &v->n) < 0) return -1;
        v->p = p;
        return 0;
    }
    PyObject *mv = PyMemoryView_FromObject(o);
    if (!mv) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyObject *tname = PyObject_GetAttrString((PyObject *)Py_TYPE(o), "__name__");
            if (tname) {
                PyErr_Format(PyExc_TypeError, "%s must be a bytes-like object, not %S",
                             what, tname);
                Py_DECREF(tname);
            }
        }
        return -1;
    }
    PyObject *b = PyBytes_FromObject(mv);
    Py_DECREF(mv);
    if (!b) return -1;
    if (PyBytes_AsStringAndSize(b, &p, &v->n) < 0) {
        Py_DECREF(b);
        return -1;
    }
    v->p = p;
    v->owned = b;
    return 0;
}

static void bview_release(bview *v)
{
    Py_CLEAR(v->owned);
}

/* Bytewise order of the sorted engine (memcmp, then the shorter first). */
static int key_cmp(const void *a, size_t al, const void *b, size_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    if (c) return c;
    return al < bl ? -1 : al > bl;
}

/* ---- the store ------------------------------------------------------------ */

typedef struct child child;
struct child {
    child *prev, *next;
    void (*detach)(child *c);     /* frees the C object; called by close */
};

typedef struct StoreObject {
    PyObject_HEAD
    nvh_kv *kv;                   /* NULL once closed                    */
    int busy;                     /* writes in flight with the GIL off   */
    int readonly;
    int sorted;                   /* engine == "sorted"                  */
    PyObject *path;               /* str                                 */
    PyObject *name;               /* str                                 */
    child children;               /* list head of iterators and batches  */
} StoreObject;

static PyObject *StoreType, *BatchType, *IterType;

static void child_link(StoreObject *s, child *c, void (*detach)(child *))
{
    c->detach = detach;
    c->next = s->children.next;
    c->prev = &s->children;
    s->children.next->prev = c;
    s->children.next = c;
}

static void child_unlink(child *c)
{
    if (!c->next) return;
    c->prev->next = c->next;
    c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

static int store_ready(StoreObject *s)
{
    if (s->kv) return 0;
    raise_local(NVH_E_INVAL, "store is closed");
    return -1;
}

/* Close: refuse new calls, let writes in flight finish, free the children's
 * C objects, then close the handle (which closes the pool). */
static int store_close_impl(StoreObject *s)
{
    nvh_kv *kv = s->kv;
    if (!kv) return 0;
    s->kv = NULL;
    while (s->busy) {
        Py_BEGIN_ALLOW_THREADS
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
        Py_END_ALLOW_THREADS
    }
    while (s->children.next != &s->children) {
        child *c = s->children.next;
        child_unlink(c);
        c->detach(c);
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = nvh_kv_close(kv);
    Py_END_ALLOW_THREADS
    return rc;
}

static PyObject *store_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "store", "engine", "create", "size", "max_size",
                             "readonly", "layout", NULL};
    PyObject *path_bytes = NULL, *create_obj = Py_True;
    const char *name = "default", *engine = NULL, *layout = NULL;
    unsigned long long size = 0, max_size = 0;
    int readonly = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&|zzOKKpz:open", kwlist,
                                     PyUnicode_FSConverter, &path_bytes, &name, &engine,
                                     &create_obj, &size, &max_size, &readonly, &layout))
        return NULL;
    if (!name) name = "default";

    nvh_kv_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (PyUnicode_Check(create_obj)) {
        PyObject *new_str = PyUnicode_FromString("new");
        int eq = new_str ? PyObject_RichCompareBool(create_obj, new_str, Py_EQ) : -1;
        Py_XDECREF(new_str);
        if (eq <= 0) {
            if (eq == 0)
                PyErr_SetString(PyExc_ValueError, "create must be True, False or \"new\"");
            Py_DECREF(path_bytes);
            return NULL;
        }
        cfg.create = NVH_KV_CREATE_NEW;
    } else {
        int t = PyObject_IsTrue(create_obj);
        if (t < 0) {
            Py_DECREF(path_bytes);
            return NULL;
        }
        cfg.create = t ? NVH_KV_CREATE_IF_MISSING : NVH_KV_OPEN_EXISTING;
    }
    if (readonly && cfg.create != NVH_KV_OPEN_EXISTING) {
        /* A read-only open never creates: open what is there. */
        cfg.create = NVH_KV_OPEN_EXISTING;
    }
    cfg.path = PyBytes_AsString(path_bytes);
    cfg.layout = layout;
    cfg.name = name;
    cfg.engine = engine;
    cfg.size = size;
    cfg.max_size = max_size;
    cfg.flags = readonly ? NVH_KV_READONLY : 0;

    nvh_kv *kv;
    int rc = 0;
    char msg[512] = "";
    Py_BEGIN_ALLOW_THREADS
    kv = nvh_kv_open(&cfg);
    if (!kv) {
        rc = nvh_errcode();
        snprintf(msg, sizeof msg, "%s", nvh_errormsg());
    }
    Py_END_ALLOW_THREADS
    if (!kv) {
        Py_DECREF(path_bytes);
        if (!rc) rc = NVH_E_INVAL;
        return raise_code_arg(rc, msg[0] ? msg : nvh_strerror(rc), NULL);
    }

    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    StoreObject *s = (StoreObject *)alloc(type, 0);
    if (!s) {
        nvh_kv_close(kv);
        Py_DECREF(path_bytes);
        return NULL;
    }
    s->kv = kv;
    s->readonly = readonly;
    s->sorted = strcmp(nvh_kv_engine(kv), "sorted") == 0;
    s->children.next = s->children.prev = &s->children;
    s->path = PyUnicode_DecodeFSDefault(PyBytes_AsString(path_bytes));
    Py_DECREF(path_bytes);
    s->name = PyUnicode_FromString(name);
    if (!s->path || !s->name) {
        Py_DECREF(s);
        return NULL;
    }
    return (PyObject *)s;
}

static void store_dealloc(PyObject *self)
{
    StoreObject *s = (StoreObject *)self;
    PyTypeObject *tp = Py_TYPE(self);
    if (s->kv) {
        /* No children can be left (each holds a reference), no write in
         * flight (it would hold one too). */
        nvh_kv_close(s->kv);
        s->kv = NULL;
    }
    Py_CLEAR(s->path);
    Py_CLEAR(s->name);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

/* --- get ------------------------------------------------------------------- */

typedef struct get_ctx {
    PyObject *value;
} get_ctx;

static int get_cb(const void *value, size_t vlen, void *arg)
{
    get_ctx *g = arg;
    g->value = PyBytes_FromStringAndSize(value, (Py_ssize_t)vlen);
    return g->value ? 0 : 1;
}

/* The value as bytes; NULL with no exception set if absent. */
static PyObject *store_lookup(StoreObject *s, PyObject *key)
{
    bview k;
    if (store_ready(s) < 0 || bview_get(key, &k, "key") < 0) return NULL;
    get_ctx g = {NULL};
    int rc = nvh_kv_get(s->kv, k.p, (size_t)k.n, get_cb, &g);
    bview_release(&k);
    if (rc == 0) return g.value;
    if (rc == 1 && !g.value) return NULL;      /* MemoryError set */
    if (rc == NVH_E_NOTFOUND) return NULL;
    return raise_nvh(rc);
}

static PyObject *store_subscript(PyObject *self, PyObject *key)
{
    PyObject *v = store_lookup((StoreObject *)self, key);
    if (!v && !PyErr_Occurred())
        return raise_code_arg(NVH_E_NOTFOUND, "key not found", key);
    return v;
}

static PyObject *store_get(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"key", "default", "buffer", NULL};
    PyObject *key, *dflt = Py_None;
    int buffer = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|Op:get", kwlist, &key, &dflt, &buffer))
        return NULL;
    PyObject *v = store_lookup((StoreObject *)self, key);
    if (!v) {
        if (PyErr_Occurred()) return NULL;
        Py_INCREF(dflt);
        return dflt;
    }
    if (buffer) {
        /* A read-only view of the private copy: the C API's zero-copy pointer
         * is valid only inside nvh_kv_get's callback (a concurrent put may
         * free the old value right after), so it cannot outlive this call. */
        PyObject *mv = PyMemoryView_FromObject(v);
        Py_DECREF(v);
        return mv;
    }
    return v;
}

static int store_contains(PyObject *self, PyObject *key)
{
    StoreObject *s = (StoreObject *)self;
    bview k;
    if (store_ready(s) < 0 || bview_get(key, &k, "key") < 0) return -1;
    int rc = nvh_kv_exists(s->kv, k.p, (size_t)k.n);
    bview_release(&k);
    if (rc < 0) {
        raise_nvh(rc);
        return -1;
    }
    return rc;
}

static Py_ssize_t store_len(PyObject *self)
{
    StoreObject *s = (StoreObject *)self;
    if (store_ready(s) < 0) return -1;
    uint64_t n = 0;
    int rc = nvh_kv_count_all(s->kv, &n);
    if (rc < 0) {
        raise_nvh(rc);
        return -1;
    }
    return (Py_ssize_t)n;
}

/* --- writes (GIL released: each flushes and fences) ------------------------ */

static int store_write(StoreObject *s, PyObject *key, PyObject *value)
{
    bview k, v = {NULL, 0, NULL};
    if (store_ready(s) < 0 || bview_get(key, &k, "key") < 0) return -1;
    if (value && bview_get(value, &v, "value") < 0) {
        bview_release(&k);
        return -1;
    }
    nvh_kv *kv = s->kv;
    int rc;
    char msg[512] = "";
    s->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = value ? nvh_kv_put(kv, k.p, (size_t)k.n, v.p, (size_t)v.n)
               : nvh_kv_remove(kv, k.p, (size_t)k.n);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", nvh_errormsg());
    Py_END_ALLOW_THREADS
    s->busy--;
    bview_release(&k);
    bview_release(&v);
    if (rc < 0) {
        if (rc == NVH_E_NOTFOUND && !value) return 0;    /* reported by the caller */
        raise_code_arg(rc, msg[0] ? msg : nvh_strerror(rc), NULL);
        return -1;
    }
    return 1;
}

static int store_ass_subscript(PyObject *self, PyObject *key, PyObject *value)
{
    int r = store_write((StoreObject *)self, key, value);
    if (r == 0) {
        raise_code_arg(NVH_E_NOTFOUND, "key not found", key);
        return -1;
    }
    return r < 0 ? -1 : 0;
}

static PyObject *store_put(PyObject *self, PyObject *args)
{
    PyObject *key, *value;
    if (!PyArg_ParseTuple(args, "OO:put", &key, &value)) return NULL;
    if (store_write((StoreObject *)self, key, value) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *store_delete(PyObject *self, PyObject *key)
{
    int r = store_write((StoreObject *)self, key, NULL);
    if (r < 0) return NULL;
    return PyBool_FromLong(r);
}

/* --- count with bounds ----------------------------------------------------- */

/* Optional bound: None, or bytes-like. */
static int bound_get(PyObject *o, bview *v, int *present, const char *what)
{
    *present = 0;
    v->owned = NULL;
    v->p = NULL;
    v->n = 0;
    if (!o || o == Py_None) return 0;
    if (bview_get(o, v, what) < 0) return -1;
    *present = 1;
    return 0;
}

static PyObject *store_count(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"lo", "hi", "lo_incl", "hi_incl", NULL};
    StoreObject *s = (StoreObject *)self;
    PyObject *lo_o = Py_None, *hi_o = Py_None;
    int lo_incl = 1, hi_incl = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OOpp:count", kwlist, &lo_o, &hi_o,
                                     &lo_incl, &hi_incl))
        return NULL;
    if (store_ready(s) < 0) return NULL;
    bview lo, hi;
    int has_lo, has_hi;
    if (bound_get(lo_o, &lo, &has_lo, "lo") < 0) return NULL;
    if (bound_get(hi_o, &hi, &has_hi, "hi") < 0) {
        bview_release(&lo);
        return NULL;
    }
    uint64_t n = 0;
    int rc = 0;
    if (has_lo && has_hi && key_cmp(lo.p, (size_t)lo.n, hi.p, (size_t)hi.n) >= 0) {
        /* Empty range, or the single key lo == hi if both ends are in. */
        if (lo_incl && hi_incl && key_cmp(lo.p, (size_t)lo.n, hi.p, (size_t)hi.n) == 0) {
            rc = nvh_kv_exists(s->kv, lo.p, (size_t)lo.n);
            if (rc > 0) n = 1;
        }
    } else {
        /* The C calls count open intervals; add the included ends. */
        if (has_lo && has_hi)
            rc = nvh_kv_count_between(s->kv, lo.p, (size_t)lo.n, hi.p, (size_t)hi.n, &n);
        else if (has_lo)
            rc = nvh_kv_count_above(s->kv, lo.p, (size_t)lo.n, &n);
        else if (has_hi)
            rc = nvh_kv_count_below(s->kv, hi.p, (size_t)hi.n, &n);
        else
            rc = nvh_kv_count_all(s->kv, &n);
        if (rc >= 0 && has_lo && lo_incl) {
            rc = nvh_kv_exists(s->kv, lo.p, (size_t)lo.n);
            if (rc > 0) n++;
        }
        if (rc >= 0 && has_hi && hi_incl) {
            rc = nvh_kv_exists(s->kv, hi.p, (size_t)hi.n);
            if (rc > 0) n++;
        }
    }
    bview_release(&lo);
    bview_release(&hi);
    if (rc < 0) return raise_nvh(rc);
    return PyLong_FromUnsignedLongLong(n);
}

/* ---- iterators ------------------------------------------------------------ */

enum iter_mode { ITER_KEYS, ITER_VALUES, ITER_ITEMS };

typedef struct IterObject {
    PyObject_HEAD
    child link;
    StoreObject *store;
    nvh_kv_iter *it;          /* sorted engine                              */
    PyObject *snapshot;       /* hash engine: sorted list of (key, value)   */
    Py_ssize_t pos;
    int mode, reverse, started, done;
    PyObject *lo, *hi;        /* bytes or NULL                              */
    int lo_incl, hi_incl;
} IterObject;

#define ITER_OF(c) ((IterObject *)((char *)(c) - offsetof(IterObject, link)))

static void iter_detach(child *c)
{
    IterObject *i = ITER_OF(c);
    if (i->it) nvh_kv_iter_free(i->it);
    i->it = NULL;       /* the next __next__ sees the closed store and raises */
}

static void iter_finish(IterObject *i)
{
    i->done = 1;
    if (i->it) {
        nvh_kv_iter_free(i->it);
        i->it = NULL;
    }
    child_unlink(&i->link);
    Py_CLEAR(i->snapshot);
}

static PyObject *iter_make(IterObject *i, const void *k, size_t kl, const void *v, size_t vl)
{
    if (i->mode == ITER_KEYS) return PyBytes_FromStringAndSize(k, (Py_ssize_t)kl);
    if (i->mode == ITER_VALUES) return PyBytes_FromStringAndSize(v, (Py_ssize_t)vl);
    PyObject *kb = PyBytes_FromStringAndSize(k, (Py_ssize_t)kl);
    PyObject *vb = kb ? PyBytes_FromStringAndSize(v, (Py_ssize_t)vl) : NULL;
    PyObject *t = vb ? PyTuple_Pack(2, kb, vb) : NULL;
    Py_XDECREF(kb);
    Py_XDECREF(vb);
    return t;
}

/* Is key past the far bound of the scan (hi going forward, lo in reverse)? */
static int iter_past_end(IterObject *i, const void *k, size_t kl)
{
    if (!i->reverse) {
        if (!i->hi) return 0;
        int c = key_cmp(k, kl, PyBytes_AsString(i->hi), (size_t)PyBytes_Size(i->hi));
        return c > 0 || (c == 0 && !i->hi_incl);
    }
    if (!i->lo) return 0;
    int c = key_cmp(k, kl, PyBytes_AsString(i->lo), (size_t)PyBytes_Size(i->lo));
    return c < 0 || (c == 0 && !i->lo_incl);
}

static PyObject *iter_next_sorted(IterObject *i)
{
    int rc;
    if (!i->started) {
        i->started = 1;
        if (!i->reverse) {
            if (i->lo) {
                const char *p = PyBytes_AsString(i->lo);
                size_t n = (size_t)PyBytes_Size(i->lo);
                rc = i->lo_incl ? nvh_kv_iter_seek_higher_eq(i->it, p, n)
                                : nvh_kv_iter_seek_higher(i->it, p, n);
            } else {
                rc = nvh_kv_iter_first(i->it);
            }
        } else {
            if (i->hi) {
                const char *p = PyBytes_AsString(i->hi);
                size_t n = (size_t)PyBytes_Size(i->hi);
                rc = i->hi_incl ? nvh_kv_iter_seek_lower_eq(i->it, p, n)
                                : nvh_kv_iter_seek_lower(i->it, p, n);
            } else {
                rc = nvh_kv_iter_last(i->it);
            }
        }
    } else {
        rc = i->reverse ? nvh_kv_iter_prev(i->it) : nvh_kv_iter_next(i->it);
    }
    const void *k = NULL, *v = NULL;
    size_t kl = 0, vl = 0;
    if (rc == 0) rc = nvh_kv_iter_key(i->it, &k, &kl);
    if (rc == 0 && i->mode != ITER_KEYS) rc = nvh_kv_iter_value(i->it, &v, &vl);
    if (rc == NVH_E_NOTFOUND || (rc == 0 && iter_past_end(i, k, kl))) {
        iter_finish(i);
        return NULL;
    }
    if (rc < 0) {
        raise_nvh(rc);
        iter_finish(i);
        return NULL;
    }
    return iter_make(i, k, kl, v, vl);
}

static PyObject *iter_next(PyObject *self)
{
    IterObject *i = (IterObject *)self;
    if (i->done) return NULL;
    if (!i->store->kv) {
        iter_finish(i);
        return raise_local(NVH_E_INVAL, "store closed during iteration");
    }
    if (i->it) return iter_next_sorted(i);
    /* hash: the sorted snapshot */
    Py_ssize_t n = PyList_Size(i->snapshot);
    if (i->pos >= n) {
        iter_finish(i);
        return NULL;
    }
    Py_ssize_t at = i->reverse ? n - 1 - i->pos : i->pos;
    i->pos++;
    PyObject *kv = PyList_GetItem(i->snapshot, at);        /* borrowed (k, v) */
    if (i->mode == ITER_ITEMS) {
        Py_INCREF(kv);
        return kv;
    }
    PyObject *r = PyTuple_GetItem(kv, i->mode == ITER_KEYS ? 0 : 1);
    Py_XINCREF(r);
    return r;
}

static PyObject *iter_self(PyObject *self)
{
    Py_INCREF(self);
    return self;
}

static void iter_dealloc(PyObject *self)
{
    IterObject *i = (IterObject *)self;
    PyTypeObject *tp = Py_TYPE(self);
    if (i->it) nvh_kv_iter_free(i->it);
    child_unlink(&i->link);
    Py_CLEAR(i->snapshot);
    Py_CLEAR(i->lo);
    Py_CLEAR(i->hi);
    Py_CLEAR(i->store);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

/* Hash engine: collect every entry as [k0, v0, k1, v1, ...] (only bytes are
 * created inside the callback), then pair and sort by key. */
static int collect_cb(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    PyObject *list = arg;
    PyObject *kb = PyBytes_FromStringAndSize(k, (Py_ssize_t)kl);
    if (!kb) return 1;
    int r = PyList_Append(list, kb);
    Py_DECREF(kb);
    if (r < 0) return 1;
    PyObject *vb = PyBytes_FromStringAndSize(v, (Py_ssize_t)vl);
    if (!vb) return 1;
    r = PyList_Append(list, vb);
    Py_DECREF(vb);
    return r < 0 ? 1 : 0;
}

static PyObject *hash_snapshot(StoreObject *s)
{
    PyObject *flat = PyList_New(0);
    if (!flat) return NULL;
    int rc = nvh_kv_get_all(s->kv, collect_cb, flat);
    if (rc != 0) {
        Py_DECREF(flat);
        if (rc == 1 && PyErr_Occurred()) return NULL;
        return raise_nvh(rc);
    }
    Py_ssize_t n = PyList_Size(flat) / 2;
    PyObject *pairs = PyList_New(n);
    if (!pairs) {
        Py_DECREF(flat);
        return NULL;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *t = PyTuple_Pack(2, PyList_GetItem(flat, 2 * j), PyList_GetItem(flat, 2 * j + 1));
        if (!t) {
            Py_DECREF(flat);
            Py_DECREF(pairs);
            return NULL;
        }
        PyList_SetItem(pairs, j, t);
    }
    Py_DECREF(flat);
    if (PyList_Sort(pairs) < 0) {     /* keys are unique: tuples order by key */
        Py_DECREF(pairs);
        return NULL;
    }
    return pairs;
}

static PyObject *iter_create(StoreObject *s, int mode, PyObject *lo_o, PyObject *hi_o,
                             int lo_incl, int hi_incl, int reverse)
{
    if (store_ready(s) < 0) return NULL;
    bview lo, hi;
    int has_lo, has_hi;
    if (bound_get(lo_o, &lo, &has_lo, "lo") < 0) return NULL;
    if (bound_get(hi_o, &hi, &has_hi, "hi") < 0) {
        bview_release(&lo);
        return NULL;
    }
    if (!s->sorted && (has_lo || has_hi)) {
        bview_release(&lo);
        bview_release(&hi);
        return raise_local(NVH_E_NOTSUP,
                           "range scans need the sorted engine (this store is a hash store)");
    }
    PyTypeObject *tp = (PyTypeObject *)IterType;
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    IterObject *i = (IterObject *)alloc(tp, 0);
    if (!i) {
        bview_release(&lo);
        bview_release(&hi);
        return NULL;
    }
    Py_INCREF(s);
    i->store = s;
    i->mode = mode;
    i->reverse = reverse;
    i->lo_incl = lo_incl;
    i->hi_incl = hi_incl;
    if (has_lo) {
        i->lo = lo.owned ? lo.owned : PyBytes_FromStringAndSize(lo.p, lo.n);
        lo.owned = NULL;
    }
    if (has_hi) {
        i->hi = hi.owned ? hi.owned : PyBytes_FromStringAndSize(hi.p, hi.n);
        hi.owned = NULL;
    }
    if ((has_lo && !i->lo) || (has_hi && !i->hi)) {
        Py_DECREF(i);
        return NULL;
    }
    if (s->sorted) {
        i->it = nvh_kv_iter_new(s->kv);
        if (!i->it) {
            int rc = nvh_errcode();
            raise_nvh(rc ? rc : NVH_E_NOMEM);
            Py_DECREF(i);
            return NULL;
        }
        child_link(s, &i->link, iter_detach);
    } else {
        i->snapshot = hash_snapshot(s);
        if (!i->snapshot) {
            Py_DECREF(i);
            return NULL;
        }
    }
    return (PyObject *)i;
}

static PyObject *store_iter_kw(PyObject *self, PyObject *args, PyObject *kwds, int mode,
                               const char *fname)
{
    static char *kwlist[] = {"lo", "hi", "lo_incl", "hi_incl", "reverse", NULL};
    PyObject *lo = Py_None, *hi = Py_None;
    int lo_incl = 1, hi_incl = 0, reverse = 0;
    char fmt[32];
    snprintf(fmt, sizeof fmt, "|OOppp:%s", fname);
    if (!PyArg_ParseTupleAndKeywords(args, kwds, fmt, kwlist, &lo, &hi, &lo_incl, &hi_incl,
                                     &reverse))
        return NULL;
    return iter_create((StoreObject *)self, mode, lo, hi, lo_incl, hi_incl, reverse);
}

static PyObject *store_keys(PyObject *self, PyObject *args, PyObject *kwds)
{
    return store_iter_kw(self, args, kwds, ITER_KEYS, "keys");
}

static PyObject *store_values(PyObject *self, PyObject *args, PyObject *kwds)
{
    return store_iter_kw(self, args, kwds, ITER_VALUES, "values");
}

static PyObject *store_items(PyObject *self, PyObject *args, PyObject *kwds)
{
    return store_iter_kw(self, args, kwds, ITER_ITEMS, "items");
}

static PyObject *store_range(PyObject *self, PyObject *args, PyObject *kwds)
{
    return store_iter_kw(self, args, kwds, ITER_ITEMS, "range");
}

static PyObject *store_iter(PyObject *self)
{
    return iter_create((StoreObject *)self, ITER_KEYS, NULL, NULL, 1, 0, 0);
}

static PyObject *store_reversed(PyObject *self, PyObject *unused)
{
    (void)unused;
    return iter_create((StoreObject *)self, ITER_KEYS, NULL, NULL, 1, 0, 1);
}

/* ---- batches -------------------------------------------------------------- */

typedef struct BatchObject {
    PyObject_HEAD
    child link;
    StoreObject *store;
    nvh_kv_batch *b;          /* NULL once committed or aborted            */
    Py_ssize_t ops;
    int state;                /* 0 open, 1 committed, 2 aborted, 3 commit in flight,
                                 4 dropped because the store was closed        */
} BatchObject;

#define BATCH_OF(c) ((BatchObject *)((char *)(c) - offsetof(BatchObject, link)))

static void batch_detach(child *c)
{
    BatchObject *b = BATCH_OF(c);
    if (b->b) nvh_kv_batch_abort(b->b);
    b->b = NULL;
    b->state = 4;
}

static int batch_ready(BatchObject *b)
{
    if (b->b && b->state == 0) return 0;
    if (!b->store || !b->store->kv || b->state == 4)
        raise_local(NVH_E_INVAL, "batch's store is closed");
    else
        raise_local(NVH_E_INVAL, b->state == 1 ? "batch already committed"
                                 : b->state == 3 ? "batch is committing"
                                                 : "batch already aborted");
    return -1;
}

static PyObject *store_batch(PyObject *self, PyObject *unused)
{
    (void)unused;
    StoreObject *s = (StoreObject *)self;
    if (store_ready(s) < 0) return NULL;
    nvh_kv_batch *cb = nvh_kv_batch_new(s->kv);
    if (!cb) {
        int rc = nvh_errcode();
        return raise_nvh(rc ? rc : NVH_E_NOMEM);
    }
    PyTypeObject *tp = (PyTypeObject *)BatchType;
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    BatchObject *b = (BatchObject *)alloc(tp, 0);
    if (!b) {
        nvh_kv_batch_abort(cb);
        return NULL;
    }
    Py_INCREF(s);
    b->store = s;
    b->b = cb;
    child_link(s, &b->link, batch_detach);
    return (PyObject *)b;
}

static int batch_op(BatchObject *b, PyObject *key, PyObject *value)
{
    bview k, v = {NULL, 0, NULL};
    if (batch_ready(b) < 0 || bview_get(key, &k, "key") < 0) return -1;
    if (value && bview_get(value, &v, "value") < 0) {
        bview_release(&k);
        return -1;
    }
    int rc = value ? nvh_kv_batch_put(b->b, k.p, (size_t)k.n, v.p, (size_t)v.n)
                   : nvh_kv_batch_remove(b->b, k.p, (size_t)k.n);
    bview_release(&k);
    bview_release(&v);
    if (rc < 0) {
        raise_nvh(rc);
        return -1;
    }
    b->ops++;
    return 0;
}

static PyObject *batch_put(PyObject *self, PyObject *args)
{
    PyObject *key, *value;
    if (!PyArg_ParseTuple(args, "OO:put", &key, &value)) return NULL;
    if (batch_op((BatchObject *)self, key, value) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *batch_delete(PyObject *self, PyObject *key)
{
    if (batch_op((BatchObject *)self, key, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}

static int batch_ass_subscript(PyObject *self, PyObject *key, PyObject *value)
{
    return batch_op((BatchObject *)self, key, value);
}

static Py_ssize_t batch_len(PyObject *self)
{
    return ((BatchObject *)self)->ops;
}

static PyObject *batch_commit(PyObject *self, PyObject *unused)
{
    (void)unused;
    BatchObject *b = (BatchObject *)self;
    if (batch_ready(b) < 0) return NULL;
    StoreObject *s = b->store;
    nvh_kv_batch *cb = b->b;
    /* nvh_kv_batch_commit frees the batch whatever it returns. */
    b->state = 3;
    child_unlink(&b->link);
    int rc;
    char msg[512] = "";
    s->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = nvh_kv_batch_commit(cb);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", nvh_errormsg());
    Py_END_ALLOW_THREADS
    s->busy--;
    b->b = NULL;
    b->state = rc < 0 ? 2 : 1;
    if (rc < 0) return raise_code_arg(rc, msg[0] ? msg : nvh_strerror(rc), NULL);
    Py_RETURN_NONE;
}

static PyObject *batch_abort(PyObject *self, PyObject *unused)
{
    (void)unused;
    BatchObject *b = (BatchObject *)self;
    if (b->state == 0 && b->b) {
        nvh_kv_batch_abort(b->b);
        b->b = NULL;
        b->state = 2;
        child_unlink(&b->link);
    }
    Py_RETURN_NONE;
}

static PyObject *batch_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    if (batch_ready((BatchObject *)self) < 0) return NULL;
    Py_INCREF(self);
    return self;
}

static PyObject *batch_exit(PyObject *self, PyObject *args)
{
    PyObject *et = Py_None, *ev = Py_None, *tb = Py_None;
    if (!PyArg_UnpackTuple(args, "__exit__", 0, 3, &et, &ev, &tb)) return NULL;
    BatchObject *b = (BatchObject *)self;
    if (et == Py_None) {
        /* Committed or aborted inside the block: done. Dropped by a close of
         * the store: say so, the block's writes are not applied. */
        if (b->state == 0 || b->state == 4) {
            PyObject *r = batch_commit(self, NULL);
            if (!r) return NULL;
            Py_DECREF(r);
        }
    } else {
        PyObject *r = batch_abort(self, NULL);
        Py_XDECREF(r);
    }
    Py_RETURN_FALSE;
}

static void batch_dealloc(PyObject *self)
{
    BatchObject *b = (BatchObject *)self;
    PyTypeObject *tp = Py_TYPE(self);
    if (b->b && b->state == 0) nvh_kv_batch_abort(b->b);   /* never committed */
    child_unlink(&b->link);
    Py_CLEAR(b->store);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

/* ---- the rest of the store ------------------------------------------------ */

static PyObject *store_close(PyObject *self, PyObject *unused)
{
    (void)unused;
    StoreObject *s = (StoreObject *)self;
    int rc = store_close_impl(s);
    if (rc < 0) return raise_nvh(rc);
    Py_RETURN_NONE;
}

static PyObject *store_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    if (store_ready((StoreObject *)self) < 0) return NULL;
    Py_INCREF(self);
    return self;
}

static PyObject *store_exit(PyObject *self, PyObject *args)
{
    (void)args;
    PyObject *r = store_close(self, NULL);
    if (!r) return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

static int dict_set_u64(PyObject *d, const char *k, uint64_t v)
{
    PyObject *o = PyLong_FromUnsignedLongLong(v);
    if (!o) return -1;
    int r = PyDict_SetItemString(d, k, o);
    Py_DECREF(o);
    return r;
}

static PyObject *store_stats(PyObject *self, PyObject *unused)
{
    (void)unused;
    StoreObject *s = (StoreObject *)self;
    if (store_ready(s) < 0) return NULL;
    nvh_kv_stats st;
    memset(&st, 0, sizeof st);
    int rc = nvh_kv_stats_get(s->kv, &st);
    if (rc < 0) return raise_nvh(rc);
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    PyObject *engine = PyUnicode_FromString(nvh_kv_engine(s->kv));
    if (!engine || PyDict_SetItemString(d, "engine", engine) < 0 ||
        dict_set_u64(d, "count", st.count) < 0 || dict_set_u64(d, "key_bytes", st.key_bytes) < 0 ||
        dict_set_u64(d, "value_bytes", st.value_bytes) < 0 ||
        dict_set_u64(d, "pool_size", st.pool_size) < 0 ||
        dict_set_u64(d, "pool_used", st.pool_used) < 0 || dict_set_u64(d, "puts", st.puts) < 0 ||
        dict_set_u64(d, "gets", st.gets) < 0 || dict_set_u64(d, "removes", st.removes) < 0 ||
        dict_set_u64(d, "batches", st.batches) < 0 ||
        dict_set_u64(d, "flushes", st.flushes) < 0 || dict_set_u64(d, "fences", st.fences) < 0) {
        Py_XDECREF(engine);
        Py_DECREF(d);
        return NULL;
    }
    Py_DECREF(engine);
    return d;
}

static PyObject *store_check(PyObject *self, PyObject *unused)
{
    (void)unused;
    StoreObject *s = (StoreObject *)self;
    if (store_ready(s) < 0) return NULL;
    int rc = nvh_kv_check(s->kv);
    if (rc < 0) return raise_nvh(rc);
    Py_RETURN_NONE;
}

static PyObject *store_get_closed(PyObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(((StoreObject *)self)->kv == NULL);
}

static PyObject *store_get_engine(PyObject *self, void *unused)
{
    (void)unused;
    return PyUnicode_FromString(((StoreObject *)self)->sorted ? "sorted" : "hash");
}

static PyObject *store_get_path(PyObject *self, void *unused)
{
    (void)unused;
    PyObject *p = ((StoreObject *)self)->path;
    Py_INCREF(p);
    return p;
}

static PyObject *store_get_name(PyObject *self, void *unused)
{
    (void)unused;
    PyObject *p = ((StoreObject *)self)->name;
    Py_INCREF(p);
    return p;
}

static PyObject *store_get_readonly(PyObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(((StoreObject *)self)->readonly);
}

static PyObject *store_repr(PyObject *self)
{
    StoreObject *s = (StoreObject *)self;
    return PyUnicode_FromFormat("<nvheap.Store %R in %R, %s%s>", s->name, s->path,
                                s->sorted ? "sorted" : "hash", s->kv ? "" : ", closed");
}

#define KW (METH_VARARGS | METH_KEYWORDS)

static PyMethodDef store_methods[] = {
    {"get", (PyCFunction)(void (*)(void))store_get, KW,
     "get(key, default=None, buffer=False): the value (bytes), or default if absent.\n"
     "buffer=True returns a read-only memoryview of a private copy."},
    {"put", store_put, METH_VARARGS, "put(key, value): insert or replace; durable on return."},
    {"delete", store_delete, METH_O, "delete(key): remove; True if it was there. Durable on return."},
    {"keys", (PyCFunction)(void (*)(void))store_keys, KW,
     "keys(lo=None, hi=None, lo_incl=True, hi_incl=False, reverse=False): keys in order."},
    {"values", (PyCFunction)(void (*)(void))store_values, KW,
     "values(lo=None, hi=None, lo_incl=True, hi_incl=False, reverse=False): values in key order."},
    {"items", (PyCFunction)(void (*)(void))store_items, KW,
     "items(lo=None, hi=None, lo_incl=True, hi_incl=False, reverse=False): (key, value) in order."},
    {"range", (PyCFunction)(void (*)(void))store_range, KW,
     "range(lo=None, hi=None, lo_incl=True, hi_incl=False, reverse=False): (key, value) pairs\n"
     "with lo <= key < hi by default (sorted engine)."},
    {"count", (PyCFunction)(void (*)(void))store_count, KW,
     "count(lo=None, hi=None, lo_incl=True, hi_incl=False): entries in the range."},
    {"batch", store_batch, METH_NOARGS,
     "batch(): an atomic batch; as a context manager it commits on normal exit and aborts on an exception."},
    {"stats", store_stats, METH_NOARGS, "stats(): a dict of the store's counters."},
    {"check", store_check, METH_NOARGS, "check(): run the engine's invariant check (raises CorruptError)."},
    {"close", store_close, METH_NOARGS, "close(): close the store and its pool (idempotent)."},
    {"__enter__", store_enter, METH_NOARGS, NULL},
    {"__exit__", store_exit, METH_VARARGS, NULL},
    {"__reversed__", store_reversed, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef store_getset[] = {
    {"closed", store_get_closed, NULL, "True once closed.", NULL},
    {"engine", store_get_engine, NULL, "\"sorted\" or \"hash\".", NULL},
    {"path", store_get_path, NULL, "The pool file.", NULL},
    {"name", store_get_name, NULL, "The store's name in the pool.", NULL},
    {"readonly", store_get_readonly, NULL, "Opened read-only.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot store_slots[] = {
    {Py_tp_doc, "A key-value store in an nvheap pool (see nvheap.open)."},
    {Py_tp_new, store_new},
    {Py_tp_dealloc, store_dealloc},
    {Py_tp_repr, store_repr},
    {Py_tp_iter, store_iter},
    {Py_tp_methods, store_methods},
    {Py_tp_getset, store_getset},
    {Py_mp_subscript, store_subscript},
    {Py_mp_ass_subscript, store_ass_subscript},
    {Py_mp_length, store_len},
    {Py_sq_contains, store_contains},
    {0, NULL},
};

static PyType_Spec store_spec = {"nvheap.Store", sizeof(StoreObject), 0, Py_TPFLAGS_DEFAULT,
                                 store_slots};

static PyMethodDef batch_methods[] = {
    {"put", batch_put, METH_VARARGS, "put(key, value): add a put to the batch."},
    {"delete", batch_delete, METH_O, "delete(key): add a remove (an absent key is no error)."},
    {"commit", batch_commit, METH_NOARGS, "commit(): apply all or nothing; durable on return."},
    {"abort", batch_abort, METH_NOARGS, "abort(): drop the batch; nothing is applied."},
    {"__enter__", batch_enter, METH_NOARGS, NULL},
    {"__exit__", batch_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot batch_slots[] = {
    {Py_tp_doc, "An atomic batch of puts and deletes (Store.batch())."},
    {Py_tp_dealloc, batch_dealloc},
    {Py_tp_methods, batch_methods},
    {Py_mp_ass_subscript, batch_ass_subscript},
    {Py_mp_length, batch_len},
    {0, NULL},
};

static PyType_Spec batch_spec = {"nvheap.Batch", sizeof(BatchObject), 0, Py_TPFLAGS_DEFAULT,
                                 batch_slots};

static PyType_Slot iter_slots[] = {
    {Py_tp_doc, "An iterator over a store in key order."},
    {Py_tp_dealloc, iter_dealloc},
    {Py_tp_iter, iter_self},
    {Py_tp_iternext, iter_next},
    {0, NULL},
};

static PyType_Spec iter_spec = {"nvheap.Iterator", sizeof(IterObject), 0, Py_TPFLAGS_DEFAULT,
                                iter_slots};

/* ---- the module ----------------------------------------------------------- */

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "nvheap._nvheap",
    "The C part of the nvheap package (see nvheap).", -1, NULL, NULL, NULL, NULL, NULL,
};

static int add_object(PyObject *m, const char *name, PyObject *o)
{
    if (!o) return -1;
    Py_INCREF(o);
    if (PyModule_AddObject(m, name, o) < 0) {
        Py_DECREF(o);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__nvheap(void);
PyMODINIT_FUNC PyInit__nvheap(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    StoreType = PyType_FromSpec(&store_spec);
    BatchType = PyType_FromSpec(&batch_spec);
    IterType = PyType_FromSpec(&iter_spec);
    if (!StoreType || !BatchType || !IterType) goto fail;
    if (add_object(m, "Store", StoreType) < 0 || add_object(m, "Batch", BatchType) < 0 ||
        add_object(m, "Iterator", IterType) < 0)
        goto fail;

    Error = PyErr_NewExceptionWithDoc(
        "nvheap.Error",
        "An nvheap call failed: .code is the NVH_E_* number, .name its name, .message "
        "the library's message.",
        NULL, NULL);
    if (!Error || add_object(m, "Error", Error) < 0) goto fail;
    for (size_t i = 0; i < N_ERRS; i++) {
        const err_def *d = &err_defs[i];
        PyObject *bases = d->extra_base == 1 ? PyTuple_Pack(2, Error, PyExc_KeyError)
                        : d->extra_base == 2 ? PyTuple_Pack(2, Error, PyExc_ValueError)
                                             : PyTuple_Pack(1, Error);
        if (!bases) goto fail;
        char qual[64];
        snprintf(qual, sizeof qual, "nvheap.%s", d->class_name);
        err_classes[i] = PyErr_NewException(qual, bases, NULL);
        Py_DECREF(bases);
        if (!err_classes[i] || add_object(m, d->class_name, err_classes[i]) < 0) goto fail;
        /* E_TOOLONG = -20, ... */
        if (PyModule_AddIntConstant(m, d->code_name + 4, d->code) < 0) goto fail;
    }
    if (PyModule_AddIntConstant(m, "KEY_MAX", NVH_KV_KEY_MAX) < 0 ||
        PyModule_AddObject(m, "VALUE_MAX", PyLong_FromSize_t(NVH_KV_VALUE_MAX)) < 0 ||
        PyModule_AddIntConstant(m, "NAME_MAX", NVH_KV_NAME_MAX) < 0)
        goto fail;
    char version[32];
    snprintf(version, sizeof version, "%d.%d.%d", NVH_VERSION_MAJOR, NVH_VERSION_MINOR,
             NVH_VERSION_PATCH);
    if (PyModule_AddStringConstant(m, "LIBRARY_VERSION", version) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
