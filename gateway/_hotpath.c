/*
 * The gateway's task frames and result frames, encoded and decoded without Thrift objects.
 *
 * The C twin of gateway/hotpath.py (the reference; read its docstring first). Both turn a
 * list of task tuples into the framed oneway submit / submit_batch messages thriftpy2
 * writes for the same tasks (byte for byte), and a framed oneway result / result_batch
 * message into result tuples, or None for any frame they do not take whole (the caller
 * then decodes it the general way: taskserver.framecheck, then thriftpy2). The tests
 * compare the two on random and fuzzed inputs (tests/unit/test_hotpath.py).
 *
 * It also maps a query's server ids to the CdfBook's rows (SlotIndex, mirroring the book's
 * dict, whose itemgetter in gateway/cdf.py is its twin), for the x_p^u solver of a large
 * fanout, and searches the book's log-CDF grid for the point where a query's summed log F
 * crosses log(p/100) (crossing, probe, search), the twins of _crossing, _probe and _search
 * in gateway/cdf.py. And it writes the "tasks" array of a query answer (render_tasks), the
 * twin of gateway/queries.py's render_answer_py. And it takes a frame's results to their
 * tasks and settles them into their queries (take, settle), the twins of
 * gateway/settle.py's take_py and settle_py.
 *
 * encode_tasks(items, max_batch_bytes) -> bytes
 * decode_results(frame, max_string, max_items, max_depth, max_duration_ms, report_type, statuses)
 *     -> [(query_id, task_index, report), ...] | None
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define VERSION_1 0x80010000u
#define TT_STOP 0
#define TT_BOOL 2
#define TT_DOUBLE 4
#define TT_I32 8
#define TT_STRUCT 12
#define TT_STRING 11
#define TT_LIST 15
#define ONEWAY 4
#define TASK_FIELDS 9
#define RESULT_FIELDS 9
#define REPORT_FIELDS 7
#define BLOB_OVERHEAD 128 /* taskserver.wire.Batcher: bytes counted per item beside its blob */

/* ---------------------------------------------------------------- encoding ---------- */

typedef struct {
    const char *s[4]; /* query_id, class_name, traceparent, tracestate (UTF-8) */
    Py_ssize_t n[4];
    const char *payload;
    Py_ssize_t payload_n; /* -1: no payload */
    int32_t index;
    int32_t priority;
    double deadline;
    double slo;
    Py_ssize_t size; /* encoded struct bytes */
} TaskView;

static int as_i32(PyObject *v, int32_t *out, const char *what) {
    long x;
    if (!PyLong_CheckExact(v)) {
        PyErr_Format(PyExc_TypeError, "%s: an int is needed", what);
        return -1;
    }
    x = PyLong_AsLong(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (x < INT32_MIN || x > INT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s: %ld is out of the i32 range", what, x);
        return -1;
    }
    *out = (int32_t)x;
    return 0;
}

static int as_double(PyObject *v, double *out, const char *what) {
    if (PyFloat_CheckExact(v)) {
        *out = PyFloat_AS_DOUBLE(v);
        return 0;
    }
    if (PyLong_CheckExact(v)) {
        *out = PyLong_AsDouble(v);
        return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
    }
    PyErr_Format(PyExc_TypeError, "%s: a float is needed", what);
    return -1;
}

/* An optional string field: None, or a str (UTF-8). */
static int as_text(PyObject *v, const char **s, Py_ssize_t *n, int required, const char *what) {
    if (v == Py_None && !required) {
        *s = NULL;
        *n = -1;
        return 0;
    }
    if (!PyUnicode_CheckExact(v)) {
        PyErr_Format(PyExc_TypeError, "%s: a str is needed", what);
        return -1;
    }
    *s = PyUnicode_AsUTF8AndSize(v, n);
    return *s == NULL ? -1 : 0;
}

static int view_task(PyObject *item, TaskView *t) {
    PyObject **f;
    Py_ssize_t size;
    int i;
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != TASK_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "a task is a tuple of 9 fields");
        return -1;
    }
    f = &PyTuple_GET_ITEM(item, 0);
    if (as_text(f[0], &t->s[0], &t->n[0], 1, "query_id") < 0) return -1;
    if (as_i32(f[1], &t->index, "task_index") < 0) return -1;
    if (as_double(f[2], &t->deadline, "deadline_budget_ms") < 0) return -1;
    if (as_double(f[3], &t->slo, "slo_budget_ms") < 0) return -1;
    if (as_i32(f[4], &t->priority, "priority") < 0) return -1;
    if (as_text(f[5], &t->s[1], &t->n[1], 0, "class_name") < 0) return -1;
    if (f[6] == Py_None) {
        t->payload = NULL;
        t->payload_n = -1;
    } else if (PyBytes_CheckExact(f[6])) {
        t->payload = PyBytes_AS_STRING(f[6]);
        t->payload_n = PyBytes_GET_SIZE(f[6]);
    } else {
        PyErr_SetString(PyExc_TypeError, "payload: bytes are needed");
        return -1;
    }
    if (as_text(f[7], &t->s[2], &t->n[2], 0, "traceparent") < 0) return -1;
    if (as_text(f[8], &t->s[3], &t->n[3], 0, "tracestate") < 0) return -1;
    /* fields 1-5: headers (3 each), the query id's length and bytes, i32, 2 doubles, i32 */
    size = 5 * 3 + 4 + t->n[0] + 4 + 8 + 8 + 4 + 1; /* + the stop byte */
    for (i = 1; i < 4; i++) {
        if (t->n[i] >= 0) size += 3 + 4 + t->n[i];
    }
    if (t->payload_n >= 0) size += 3 + 4 + t->payload_n;
    t->size = size;
    return 0;
}

static inline char *put_u8(char *p, int v) {
    *p++ = (char)v;
    return p;
}

static inline char *put_i16(char *p, int v) {
    *p++ = (char)((v >> 8) & 0xff);
    *p++ = (char)(v & 0xff);
    return p;
}

static inline char *put_i32(char *p, uint32_t v) {
    *p++ = (char)(v >> 24);
    *p++ = (char)(v >> 16);
    *p++ = (char)(v >> 8);
    *p++ = (char)v;
    return p;
}

static inline char *put_f64(char *p, double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    p = put_i32(p, (uint32_t)(u >> 32));
    return put_i32(p, (uint32_t)u);
}

static inline char *put_head(char *p, int type, int id) { return put_i16(put_u8(p, type), id); }

static inline char *put_bytes(char *p, const char *s, Py_ssize_t n) {
    p = put_i32(p, (uint32_t)n);
    memcpy(p, s, (size_t)n);
    return p + n;
}

/* One Task struct, its fields in IDL order (what thriftpy2's write_struct does). */
static char *put_task(char *p, const TaskView *t) {
    p = put_bytes(put_head(p, TT_STRING, 1), t->s[0], t->n[0]);
    p = put_i32(put_head(p, TT_I32, 2), (uint32_t)t->index);
    p = put_f64(put_head(p, TT_DOUBLE, 3), t->deadline);
    p = put_f64(put_head(p, TT_DOUBLE, 4), t->slo);
    p = put_i32(put_head(p, TT_I32, 5), (uint32_t)t->priority);
    if (t->n[1] >= 0) p = put_bytes(put_head(p, TT_STRING, 6), t->s[1], t->n[1]);
    if (t->payload_n >= 0) p = put_bytes(put_head(p, TT_STRING, 7), t->payload, t->payload_n);
    if (t->n[2] >= 0) p = put_bytes(put_head(p, TT_STRING, 8), t->s[2], t->n[2]);
    if (t->n[3] >= 0) p = put_bytes(put_head(p, TT_STRING, 9), t->s[3], t->n[3]);
    return put_u8(p, TT_STOP);
}

/* Bytes of the framed message carrying tasks[a:b]. */
static Py_ssize_t frame_size(const TaskView *t, Py_ssize_t a, Py_ssize_t b) {
    Py_ssize_t body = 0, i;
    for (i = a; i < b; i++) body += t[i].size;
    if (b - a == 1) return 4 + 4 + 4 + 6 + 4 + 3 + body + 1;  /* "submit" */
    return 4 + 4 + 4 + 12 + 4 + 3 + 5 + body + 1;              /* "submit_batch" */
}

static char *put_frame(char *p, const TaskView *t, Py_ssize_t a, Py_ssize_t b) {
    Py_ssize_t i, size = frame_size(t, a, b);
    p = put_i32(p, (uint32_t)(size - 4));
    p = put_i32(p, VERSION_1 | ONEWAY);
    if (b - a == 1) {
        p = put_bytes(p, "submit", 6);
        p = put_i32(p, 0);
        p = put_task(put_head(p, TT_STRUCT, 1), &t[a]);
    } else {
        p = put_bytes(p, "submit_batch", 12);
        p = put_i32(p, 0);
        p = put_head(p, TT_LIST, 1);
        p = put_u8(p, TT_STRUCT);
        p = put_i32(p, (uint32_t)(b - a));
        for (i = a; i < b; i++) p = put_task(p, &t[i]);
    }
    return put_u8(p, TT_STOP);
}

static PyObject *encode_tasks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *items, *out = NULL;
    TaskView *views = NULL;
    Py_ssize_t n, i, start, total, max_batch, size, *cuts = NULL, ncuts = 0;
    char *p;
    (void)self;
    if (nargs != 2 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "encode_tasks(items: list, max_batch_bytes: int)");
        return NULL;
    }
    items = args[0];
    max_batch = PyLong_AsSsize_t(args[1]);
    if (max_batch == -1 && PyErr_Occurred()) return NULL;
    n = PyList_GET_SIZE(items);
    if (n == 0) return PyBytes_FromStringAndSize(NULL, 0);
    views = PyMem_Malloc((size_t)n * sizeof(TaskView));
    cuts = PyMem_Malloc((size_t)(n + 1) * sizeof(Py_ssize_t));
    if (views == NULL || cuts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    total = 0;
    for (i = 0; i < n; i++) {
        if (view_task(PyList_GET_ITEM(items, i), &views[i]) < 0) goto done;
        total += (views[i].payload_n > 0 ? views[i].payload_n : 0) + BLOB_OVERHEAD;
    }
    /* Frames as taskserver.wire.Batcher.encode cuts them: one, unless the payloads (and
     * BLOB_OVERHEAD an item) exceed max_batch_bytes; then greedily, never splitting one. */
    cuts[ncuts++] = 0;
    if (total > max_batch) {
        total = 0;
        for (i = 0; i < n; i++) {
            Py_ssize_t s = (views[i].payload_n > 0 ? views[i].payload_n : 0) + BLOB_OVERHEAD;
            if (total && total + s > max_batch) {
                cuts[ncuts++] = i;
                total = 0;
            }
            total += s;
        }
    }
    cuts[ncuts] = n;
    size = 0;
    for (i = 0; i < ncuts; i++) size += frame_size(views, cuts[i], cuts[i + 1]);
    out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) goto done;
    p = PyBytes_AS_STRING(out);
    for (start = 0; start < ncuts; start++) p = put_frame(p, views, cuts[start], cuts[start + 1]);
    if (p != PyBytes_AS_STRING(out) + size) {
        Py_CLEAR(out);
        PyErr_SetString(PyExc_SystemError, "encode_tasks: size mismatch");
    }
done:
    PyMem_Free(views);
    PyMem_Free(cuts);
    return out;
}

/* ---------------------------------------------------------------- decoding ---------- */

typedef struct {
    const unsigned char *buf;
    Py_ssize_t pos;
    Py_ssize_t end;
    Py_ssize_t max_string;
} Reader;

static inline int take(Reader *r, Py_ssize_t n) {
    if (n < 0 || r->end - r->pos < n) return -1;
    return 0;
}

static inline int get_u8(Reader *r, int *v) {
    if (take(r, 1) < 0) return -1;
    *v = r->buf[r->pos++];
    return 0;
}

static inline int get_i16(Reader *r, int *v) {
    const unsigned char *p;
    if (take(r, 2) < 0) return -1;
    p = r->buf + r->pos;
    *v = (int16_t)(((unsigned)p[0] << 8) | p[1]);
    r->pos += 2;
    return 0;
}

static inline int get_u32(Reader *r, uint32_t *v) {
    const unsigned char *p;
    if (take(r, 4) < 0) return -1;
    p = r->buf + r->pos;
    *v = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
    r->pos += 4;
    return 0;
}

static inline int get_f64(Reader *r, double *d) {
    uint32_t hi, lo;
    uint64_t u;
    if (get_u32(r, &hi) < 0 || get_u32(r, &lo) < 0) return -1;
    u = ((uint64_t)hi << 32) | lo;
    memcpy(d, &u, 8);
    return 0;
}

/* A string's bytes: its start and length, within the frame and max_string. */
static inline int get_blob(Reader *r, const char **s, Py_ssize_t *n) {
    uint32_t len;
    if (get_u32(r, &len) < 0) return -1;
    if ((int32_t)len < 0 || (Py_ssize_t)len > r->max_string || take(r, (Py_ssize_t)len) < 0)
        return -1;
    *s = (const char *)r->buf + r->pos;
    *n = (Py_ssize_t)len;
    r->pos += (Py_ssize_t)len;
    return 0;
}

/* Status names to the objects a result tuple carries (TaskStatus members), 0..4. */
#define STATUSES 5

/* One TaskResult struct into a tuple: -1 with no error set when the frame is not taken,
 * -1 with an error set on a failure of Python itself. */
static PyObject *get_result(Reader *r, double max_duration, PyObject *report_type,
                            PyObject *statuses) {
    const char *qid = NULL, *res = NULL, *err = NULL;
    Py_ssize_t qid_n = 0, res_n = 0, err_n = 0;
    uint32_t index = 0, status = 0;
    double d[3] = {0.0, 0.0, 0.0};
    int missed = 0, seen = 0, type, id, i;
    PyObject *fields[RESULT_FIELDS], *tuple, *report;
    for (;;) {
        if (get_u8(r, &type) < 0) return NULL;
        if (type == TT_STOP) break;
        if (get_i16(r, &id) < 0 || id < 1 || id > RESULT_FIELDS) return NULL;
        if (seen & (1 << id)) return NULL; /* a field twice: left to the general decoder */
        seen |= 1 << id;
        switch (id) {
        case 1:
            if (type != TT_STRING || get_blob(r, &qid, &qid_n) < 0) return NULL;
            break;
        case 2:
            if (type != TT_I32 || get_u32(r, &index) < 0) return NULL;
            break;
        case 3:
            if (type != TT_I32 || get_u32(r, &status) < 0) return NULL;
            break;
        case 4:
        case 5:
        case 6:
            if (type != TT_DOUBLE || get_f64(r, &d[id - 4]) < 0) return NULL;
            break;
        case 7:
            if (type != TT_BOOL || get_u8(r, &missed) < 0) return NULL;
            break;
        case 8:
            if (type != TT_STRING || get_blob(r, &res, &res_n) < 0) return NULL;
            break;
        case 9:
            if (type != TT_STRING || get_blob(r, &err, &err_n) < 0) return NULL;
            break;
        }
    }
    if ((seen & 0xfe) != 0xfe) return NULL; /* a required field (1-7) is missing */
    if (status >= STATUSES) return NULL;
    for (i = 0; i < 3; i++) {
        if (!(d[i] >= 0.0 && d[i] <= max_duration)) return NULL; /* NaN fails too */
    }
    if (d[0] > d[2]) return NULL; /* queue wait above the server's whole time: result_problem */
    fields[0] = PyUnicode_DecodeUTF8(qid, qid_n, NULL);
    if (fields[0] == NULL) {
        PyErr_Clear(); /* not UTF-8: thriftpy2 gives bytes, the general path handles it */
        return NULL;
    }
    if (seen & (1 << 9)) {
        fields[8] = PyUnicode_DecodeUTF8(err, err_n, NULL);
        if (fields[8] == NULL) {
            PyErr_Clear();
            Py_DECREF(fields[0]);
            return NULL;
        }
    } else {
        fields[8] = Py_NewRef(Py_None);
    }
    fields[1] = PyLong_FromLong((long)(int32_t)index);
    fields[2] = Py_NewRef(PyList_GET_ITEM(statuses, status));
    fields[3] = PyFloat_FromDouble(d[0]);
    fields[4] = PyFloat_FromDouble(d[1]);
    fields[5] = PyFloat_FromDouble(d[2]);
    fields[6] = Py_NewRef(missed ? Py_True : Py_False);
    fields[7] = (seen & (1 << 8)) ? PyBytes_FromStringAndSize(res, res_n) : Py_NewRef(Py_None);
    report = report_type == Py_None
                 ? PyTuple_New(REPORT_FIELDS)
                 : ((PyTypeObject *)report_type)->tp_alloc((PyTypeObject *)report_type,
                                                           REPORT_FIELDS);
    tuple = PyTuple_New(3);
    for (i = 0; i < RESULT_FIELDS; i++) {
        if (fields[i] == NULL || report == NULL || tuple == NULL) {
            int j;
            for (j = 0; j < RESULT_FIELDS; j++) Py_XDECREF(fields[j]);
            Py_XDECREF(report);
            Py_XDECREF(tuple);
            if (!PyErr_Occurred()) PyErr_NoMemory();
            return NULL;
        }
    }
    /* (query_id, task_index, (status, queue_ms, service_ms, server_ms, missed, result, error)) */
    for (i = 0; i < REPORT_FIELDS; i++) PyTuple_SET_ITEM(report, i, fields[i + 2]);
    PyTuple_SET_ITEM(tuple, 0, fields[0]);
    PyTuple_SET_ITEM(tuple, 1, fields[1]);
    PyTuple_SET_ITEM(tuple, 2, report);
    return tuple;
}

static PyObject *decode_results(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer view;
    Reader r;
    PyObject *out = NULL, *report_type, *statuses, *item;
    uint32_t head, seqid, count = 0;
    const char *name;
    Py_ssize_t name_n, max_items, i;
    double max_duration;
    int max_depth, type, id, batch;
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "decode_results(frame, max_string, max_items, max_depth, "
                        "max_duration_ms, report_type, statuses)");
        return NULL;
    }
    r.max_string = PyLong_AsSsize_t(args[1]);
    max_items = PyLong_AsSsize_t(args[2]);
    max_depth = (int)PyLong_AsLong(args[3]);
    max_duration = PyFloat_AsDouble(args[4]);
    if (PyErr_Occurred()) return NULL;
    report_type = args[5];
    statuses = args[6];
    if (report_type != Py_None &&
        !(PyType_Check(report_type) &&
          PyType_IsSubtype((PyTypeObject *)report_type, &PyTuple_Type) &&
          ((PyTypeObject *)report_type)->tp_itemsize == PyTuple_Type.tp_itemsize &&
          ((PyTypeObject *)report_type)->tp_basicsize == PyTuple_Type.tp_basicsize)) {
        PyErr_SetString(PyExc_TypeError, "report_type: None or a tuple subclass without a dict");
        return NULL;
    }
    if (!PyList_CheckExact(statuses) || PyList_GET_SIZE(statuses) != STATUSES) {
        PyErr_SetString(PyExc_TypeError, "statuses: a list of the 5 task statuses");
        return NULL;
    }
    if (max_depth < 3) Py_RETURN_NONE; /* message struct, list, result struct */
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    r.buf = (const unsigned char *)view.buf;
    r.pos = 0;
    r.end = view.len;
    if (get_u32(&r, &head) < 0 || head != (VERSION_1 | ONEWAY)) goto not_taken;
    if (get_blob(&r, &name, &name_n) < 0) goto not_taken;
    if (name_n == 12 && memcmp(name, "result_batch", 12) == 0) {
        batch = 1;
    } else if (name_n == 6 && memcmp(name, "result", 6) == 0) {
        batch = 0;
    } else {
        goto not_taken;
    }
    if (get_u32(&r, &seqid) < 0) goto not_taken;
    if (get_u8(&r, &type) < 0 || get_i16(&r, &id) < 0 || id != 1) goto not_taken;
    if (batch) {
        int elem;
        if (type != TT_LIST || get_u8(&r, &elem) < 0 || elem != TT_STRUCT) goto not_taken;
        if (get_u32(&r, &count) < 0 || (int32_t)count < 0 || (Py_ssize_t)count > max_items)
            goto not_taken;
        /* A result is at least its seven required fields: no list longer than the frame. */
        if ((Py_ssize_t)count > (r.end - r.pos) / 40) goto not_taken;
    } else {
        if (type != TT_STRUCT) goto not_taken;
        count = 1;
    }
    out = PyList_New((Py_ssize_t)count);
    if (out == NULL) goto fail;
    for (i = 0; i < (Py_ssize_t)count; i++) {
        item = get_result(&r, max_duration, report_type, statuses);
        if (item == NULL) {
            if (PyErr_Occurred()) goto fail;
            goto not_taken;
        }
        PyList_SET_ITEM(out, i, item);
    }
    if (get_u8(&r, &type) < 0 || type != TT_STOP || r.pos != r.end) goto not_taken;
    PyBuffer_Release(&view);
    return out;
not_taken:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

/* ---------------------------------------------------------------- CDF rows ---------- */

/* SlotIndex: the CdfBook's server id -> slot, mirrored from its dict (gateway/cdf.py keeps
 * both, writing each change to both), for the lookup of a query's ids: a hash table of
 * exact-str keys, open addressing with linear probing, at most half full. A key is first
 * compared by identity (the ids a gateway passes are the strings it registered), then by
 * hash, length, kind and bytes. A dict lookup through the C API costs ~20-25 ns here even
 * with every line in L1 (measured at 1,000 ids); this one ~4 ns when the ids are the
 * registered objects, ~14 ns when they are equal strings of their own.
 *
 * SlotIndex() ; set(key: str, slot: int) ; discard(key) -> bool ; lookup(ids) -> bytes of
 * native Py_ssize_t (numpy.frombuffer), KeyError(id) for an id it lacks, None when an id is
 * not an exact str (the caller then asks the dict, whose __eq__ and __hash__ rules apply) ;
 * len(index). */
typedef struct {
    PyObject *key; /* an exact str, held; NULL: empty */
    Py_hash_t hash;
    Py_ssize_t slot;
} IndexEntry;

typedef struct {
    PyObject_HEAD
    IndexEntry *table;
    Py_ssize_t mask, used; /* capacity - 1 (a power of two), live keys */
} SlotIndex;

static Py_hash_t str_hash(PyObject *key) {
    Py_hash_t h = ((PyASCIIObject *)key)->hash; /* cached by str itself once computed */
    return h != -1 ? h : PyObject_Hash(key);
}

static int str_equal(PyObject *a, PyObject *b) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(a);
    int kind = PyUnicode_KIND(a);
    return n == PyUnicode_GET_LENGTH(b) && kind == PyUnicode_KIND(b) &&
           memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)n * (size_t)kind) == 0;
}

/* the entry holding key, or the empty one where it would go */
static IndexEntry *index_find(const SlotIndex *ix, PyObject *key, Py_hash_t hash) {
    size_t i = (size_t)hash & (size_t)ix->mask;
    for (;;) {
        IndexEntry *e = &ix->table[i];
        if (e->key == key || e->key == NULL) return e;
        if (e->hash == hash && str_equal(e->key, key)) return e;
        i = (i + 1) & (size_t)ix->mask;
    }
}

static int index_resize(SlotIndex *ix, Py_ssize_t capacity) {
    IndexEntry *old = ix->table, *e;
    Py_ssize_t old_capacity = old == NULL ? 0 : ix->mask + 1, i;
    IndexEntry *table = PyMem_Calloc((size_t)capacity, sizeof(IndexEntry));
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    ix->table = table;
    ix->mask = capacity - 1;
    for (i = 0; i < old_capacity; i++) {
        if (old[i].key == NULL) continue;
        e = index_find(ix, old[i].key, old[i].hash);
        *e = old[i];
    }
    PyMem_Free(old);
    return 0;
}

static PyObject *index_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    SlotIndex *ix;
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "SlotIndex() takes no arguments");
        return NULL;
    }
    ix = (SlotIndex *)type->tp_alloc(type, 0);
    if (ix == NULL) return NULL;
    if (index_resize(ix, 8) < 0) {
        Py_DECREF(ix);
        return NULL;
    }
    return (PyObject *)ix;
}

static void index_dealloc(SlotIndex *ix) {
    Py_ssize_t i;
    if (ix->table != NULL) {
        for (i = 0; i <= ix->mask; i++) Py_XDECREF(ix->table[i].key);
        PyMem_Free(ix->table);
    }
    Py_TYPE(ix)->tp_free((PyObject *)ix);
}

static Py_ssize_t index_len(SlotIndex *ix) { return ix->used; }

static PyObject *index_set(SlotIndex *ix, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *key;
    Py_hash_t hash;
    Py_ssize_t slot;
    IndexEntry *e;
    if (nargs != 2 || !PyUnicode_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "SlotIndex.set(key: str, slot: int)");
        return NULL;
    }
    key = args[0];
    slot = PyLong_AsSsize_t(args[1]);
    if (slot == -1 && PyErr_Occurred()) return NULL;
    hash = str_hash(key);
    if (hash == -1) return NULL;
    if (2 * (ix->used + 1) > ix->mask + 1 && index_resize(ix, 2 * (ix->mask + 1)) < 0)
        return NULL;
    e = index_find(ix, key, hash);
    if (e->key == NULL) ix->used++;
    Py_INCREF(key); /* the newest object: the one the gateway's links now hold */
    Py_XSETREF(e->key, key);
    e->hash = hash;
    e->slot = slot;
    Py_RETURN_NONE;
}

static PyObject *index_discard(SlotIndex *ix, PyObject *key) {
    Py_hash_t hash;
    IndexEntry *e;
    PyObject *held;
    size_t i, j, home, mask = (size_t)ix->mask;
    if (!PyUnicode_CheckExact(key)) Py_RETURN_FALSE; /* never set */
    hash = str_hash(key);
    if (hash == -1) return NULL;
    e = index_find(ix, key, hash);
    if (e->key == NULL) Py_RETURN_FALSE;
    held = e->key;
    /* Backward shift: each later entry of the probe run moves into the hole when the hole
     * lies between its home and where it sits, so no tombstone is needed and every run a
     * lookup walks stays unbroken. */
    i = (size_t)(e - ix->table);
    for (j = (i + 1) & mask; ix->table[j].key != NULL; j = (j + 1) & mask) {
        home = (size_t)ix->table[j].hash & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            ix->table[i] = ix->table[j];
            i = j;
        }
    }
    ix->table[i].key = NULL;
    ix->used--;
    Py_DECREF(held);
    Py_RETURN_TRUE;
}

static PyObject *index_lookup(SlotIndex *ix, PyObject *ids) {
    PyObject *seq, *out, *key;
    Py_ssize_t n, i, *dst;
    Py_hash_t hash;
    IndexEntry *e;
    seq = PySequence_Fast(ids, "ids: a sequence is needed");
    if (seq == NULL) return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(Py_ssize_t));
    if (out == NULL) goto fail;
    dst = (Py_ssize_t *)PyBytes_AS_STRING(out);
    for (i = 0; i < n; i++) {
        key = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyUnicode_CheckExact(key)) {
            Py_DECREF(out);
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
        hash = str_hash(key);
        if (hash == -1) goto fail;
        e = index_find(ix, key, hash);
        if (e->key == NULL) {
            PyErr_SetObject(PyExc_KeyError, key);
            goto fail;
        }
        dst[i] = e->slot;
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef index_methods[] = {
    {"set", (PyCFunction)(void (*)(void))index_set, METH_FASTCALL,
     "set(key: str, slot: int): map key to slot"},
    {"discard", (PyCFunction)index_discard, METH_O,
     "discard(key) -> bool: forget key (False if it was not there)"},
    {"lookup", (PyCFunction)index_lookup, METH_O,
     "lookup(ids) -> bytes of native Py_ssize_t, the slot of each id (KeyError for one "
     "missing), or None when an id is not an exact str"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods index_as_sequence = {.sq_length = (lenfunc)index_len};

static PyTypeObject SlotIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gateway._hotpath.SlotIndex",
    .tp_basicsize = sizeof(SlotIndex),
    .tp_dealloc = (destructor)index_dealloc,
    .tp_as_sequence = &index_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Server id -> CDF slot, for the lookup of a query's ids (gateway/cdf.py).",
    .tp_methods = index_methods,
    .tp_new = index_new,
};

/* ---------------------------------------------------------------- the grid search ---- */

/* A float32 matrix of shape (points, capacity), C-contiguous, and a 1-D buffer of native
 * Py_ssize_t rows, each in [0, capacity). */
typedef struct {
    Py_buffer m, r;
    const float *data;
    const Py_ssize_t *rows;
    Py_ssize_t points, capacity, k;
} Grid;

static void grid_release(Grid *g) {
    if (g->m.obj != NULL) PyBuffer_Release(&g->m);
    if (g->r.obj != NULL) PyBuffer_Release(&g->r);
}

static int grid_open(Grid *g, PyObject *matrix, PyObject *rows) {
    Py_ssize_t i;
    memset(g, 0, sizeof(*g));
    if (PyObject_GetBuffer(matrix, &g->m, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (g->m.ndim != 2 || g->m.itemsize != 4 || g->m.format == NULL ||
        strcmp(g->m.format, "f") != 0) {
        PyErr_SetString(PyExc_TypeError, "matrix: a C-contiguous 2-D float32 array is needed");
        goto fail;
    }
    if (PyObject_GetBuffer(rows, &g->r, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto fail;
    if (g->r.ndim != 1 || g->r.itemsize != (Py_ssize_t)sizeof(Py_ssize_t) || g->r.format == NULL ||
        (strcmp(g->r.format, "n") != 0 && strcmp(g->r.format, "l") != 0 &&
         strcmp(g->r.format, "q") != 0)) {
        PyErr_SetString(PyExc_TypeError, "rows: a 1-D array of native intp is needed");
        goto fail;
    }
    g->data = (const float *)g->m.buf;
    g->rows = (const Py_ssize_t *)g->r.buf;
    g->points = g->m.shape[0];
    g->capacity = g->m.shape[1];
    g->k = g->r.shape[0];
    for (i = 0; i < g->k; i++) {
        if (g->rows[i] < 0 || g->rows[i] >= g->capacity) {
            PyErr_Format(PyExc_IndexError, "rows[%zd] = %zd is outside [0, %zd)", i, g->rows[i],
                         g->capacity);
            goto fail;
        }
    }
    return 0;
fail:
    grid_release(g);
    return -1;
}

/* The sum over the rows of line[row], in double, in SUM_LANES lanes: lane j adds the rows
 * at positions j, j + SUM_LANES, ... in their order, from -0.0 (the identity of +, signed
 * zeros included); then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). One chain of
 * adds, one per row, would wait on the adder's latency (~4 cycles) at every row; eight
 * independent chains keep it busy. gateway/cdf.py's _sum_at adds in this order too, so the
 * twins agree to the bit. */
#define SUM_LANES 8
static double lane_sum(const float *line, const Py_ssize_t *rows, Py_ssize_t k) {
    double l[SUM_LANES] = {-0.0, -0.0, -0.0, -0.0, -0.0, -0.0, -0.0, -0.0};
    Py_ssize_t i = 0, j;
    for (; i + SUM_LANES <= k; i += SUM_LANES) {
        for (j = 0; j < SUM_LANES; j++) l[j] += (double)line[rows[i + j]];
    }
    for (j = 0; i + j < k; j++) l[j] += (double)line[rows[i + j]];
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* sum over the rows of matrix[point, row] (lane_sum's order) */
static double grid_sum(const Grid *g, Py_ssize_t point) {
    return lane_sum(g->data + point * g->capacity, g->rows, g->k);
}

/* The first point of `points` lines (each `capacity` floats) whose sum over the rows is
 * >= level, by bisection, with the sums taken at the final lo - 1 and hi (NaN if none). */
static Py_ssize_t bisect_lines(const float *data, Py_ssize_t points, Py_ssize_t capacity,
                               const Py_ssize_t *rows, Py_ssize_t k, double level,
                               double *below, double *at) {
    Py_ssize_t lo = 0, hi = points, mid;
    double sum;
    *below = *at = Py_NAN;
    while (lo < hi) {
        mid = lo + (hi - lo) / 2;
        sum = lane_sum(data + mid * capacity, rows, k);
        if (sum < level) {
            lo = mid + 1;
            *below = sum; /* lo only rises: the last one is the sum at the final lo - 1 */
        } else {
            hi = mid;
            *at = sum; /* likewise at the final hi */
        }
    }
    return lo;
}

/* crossing(matrix, rows, level) -> (index, below, at): the first point whose sum over the
 * rows is >= level (points when none is), by bisection (each row of L is a log CDF on an
 * ascending grid, so the sums do not fall from one point to the next), with the sums the
 * bisection took at index - 1 and at index (NaN where it took none: index 0, or points). */
static PyObject *crossing(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Grid g;
    double level, below, at;
    Py_ssize_t lo;
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "crossing(matrix, rows, level)");
        return NULL;
    }
    level = PyFloat_AsDouble(args[2]);
    if (level == -1.0 && PyErr_Occurred()) return NULL;
    if (grid_open(&g, args[0], args[1]) < 0) return NULL;
    lo = bisect_lines(g.data, g.points, g.capacity, g.rows, g.k, level, &below, &at);
    grid_release(&g);
    return Py_BuildValue("(ndd)", lo, below, at);
}

/* probe(matrix, rows, point) -> float: the sum over the rows at one point */
static PyObject *probe(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Grid g;
    Py_ssize_t point;
    double total;
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "probe(matrix, rows, point)");
        return NULL;
    }
    point = PyLong_AsSsize_t(args[2]);
    if (point == -1 && PyErr_Occurred()) return NULL;
    if (grid_open(&g, args[0], args[1]) < 0) return NULL;
    if (point < 0 || point >= g.points) {
        PyErr_Format(PyExc_IndexError, "point %zd is outside [0, %zd)", point, g.points);
        grid_release(&g);
        return NULL;
    }
    total = grid_sum(&g, point);
    grid_release(&g);
    return PyFloat_FromDouble(total);
}

/* search(coarse, blocks, rows, level, threshold) -> None | (cell, step, below, at, least):
 * CdfBook._solve_rows' search of the grid in one call, the twin of gateway/cdf.py's
 * _search_py. None when the rows are all one row (the caller's closed form). Otherwise
 * cell = crossing(coarse, rows, level)[0]; for 1 <= cell <= len(blocks), (step, below, at)
 * = crossing(blocks[cell - 1], rows, level), else step = -1 and NaN sums; and least = the
 * smallest threshold[row] over the rows (NaN if any is NaN, as numpy's min). */
static PyObject *search(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Grid g;
    Py_buffer b, t;
    const double *thr;
    double level, below = Py_NAN, at = Py_NAN, least;
    Py_ssize_t cell, step = -1, first, i, r, steps;
    int same = 1;
    PyObject *out = NULL;
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "search(coarse, blocks, rows, level, threshold)");
        return NULL;
    }
    level = PyFloat_AsDouble(args[3]);
    if (level == -1.0 && PyErr_Occurred()) return NULL;
    if (grid_open(&g, args[0], args[2]) < 0) return NULL;
    memset(&b, 0, sizeof(b));
    memset(&t, 0, sizeof(t));
    if (PyObject_GetBuffer(args[1], &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
    if (b.ndim != 3 || b.itemsize != 4 || b.format == NULL || strcmp(b.format, "f") != 0 ||
        b.shape[0] != g.points - 1 || b.shape[1] < 1 || b.shape[2] != g.capacity) {
        PyErr_SetString(PyExc_TypeError,
                        "blocks: a C-contiguous float32 array of shape (points - 1, steps, "
                        "capacity) is needed");
        goto done;
    }
    if (PyObject_GetBuffer(args[4], &t, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
    if (t.ndim != 1 || t.itemsize != 8 || t.format == NULL || strcmp(t.format, "d") != 0 ||
        t.shape[0] < g.capacity) {
        PyErr_SetString(PyExc_TypeError,
                        "threshold: a 1-D float64 array of at least capacity values is needed");
        goto done;
    }
    if (g.k == 0) {
        PyErr_SetString(PyExc_ValueError, "rows is empty");
        goto done;
    }
    thr = (const double *)t.buf;
    first = g.rows[0];
    least = thr[first];
    for (i = 1; i < g.k; i++) {
        r = g.rows[i];
        same &= r == first;
        if (thr[r] < least || isnan(thr[r])) least = thr[r];
    }
    if (same) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    cell = bisect_lines(g.data, g.points, g.capacity, g.rows, g.k, level, &below, &at);
    below = at = Py_NAN;
    if (cell >= 1 && cell <= b.shape[0]) {
        steps = b.shape[1];
        step = bisect_lines((const float *)b.buf + (cell - 1) * steps * g.capacity, steps,
                            g.capacity, g.rows, g.k, level, &below, &at);
    }
    out = Py_BuildValue("(nnddd)", cell, step, below, at, least);
done:
    if (t.obj != NULL) PyBuffer_Release(&t);
    if (b.obj != NULL) PyBuffer_Release(&b);
    grid_release(&g);
    return out;
}

/* ---------------------------------------------------------------- answers ----------- */

/* render_tasks(outcomes, loads, max_depth, embed, text, number) -> bytes | None: the "tasks"
 * array of a query answer as JSON, the twin of the entries gateway/queries.py's
 * render_answer_py builds (TaskOutcome.entry, then orjson.dumps), byte for byte. Each
 * distinct task result is read once: `loads` (orjson.loads) and a count of its brackets
 * take most as they are; `embed(raw)` gives the JSON text of the others (gateway.queries:
 * _embedded_json, the rule itself), `text(s)` the JSON text of a string that
 * needs escaping, `number(x)` the JSON text of round(x, 4) where this file's own rounding
 * cannot tell (a tie, or a value too large for its margin); what they raise propagates.
 * None for an outcome with a field of a type it does not write (the caller renders it). */

static PyObject *attr_names[11]; /* TaskOutcome's fields, in its order */
static const char *attr_text[11] = {
    "server", "status", "queue_ms", "service_ms", "post_queue_ms", "server_ms",
    "missed_deadline", "result", "error", "estimated_wait_ms", "retries",
};

typedef struct {
    char *p;
    Py_ssize_t n, cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t extra) {
    Py_ssize_t cap;
    char *p;
    if (b->n + extra <= b->cap) return 0;
    cap = b->cap * 2 > b->n + extra + 256 ? b->cap * 2 : b->n + extra + 256;
    p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_grow(b, n) < 0) return -1;
    memcpy(b->p + b->n, s, (size_t)n);
    b->n += n;
    return 0;
}

#define PUT_LIT(b, lit) buf_put((b), (lit), (Py_ssize_t)(sizeof(lit) - 1))

/* bytes returned by a callback, appended (a TypeError if it returned something else). */
static int put_call(Buf *b, PyObject *fn, PyObject *arg) {
    int rc;
    PyObject *out = PyObject_CallOneArg(fn, arg);
    if (out == NULL) return -1;
    if (!PyBytes_Check(out)) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_TypeError, "render_tasks: a callback must return bytes");
        return -1;
    }
    rc = buf_put(b, PyBytes_AS_STRING(out), PyBytes_GET_SIZE(out));
    Py_DECREF(out);
    return rc;
}

/* 0 written, 1 not taken (not a str), -1 error. ASCII without a character JSON escapes (nor
 * DEL, which JSON does not escape but is left to orjson all the same) is copied between
 * quotes; anything else is the `text` callback's. */
static int put_text(Buf *b, PyObject *s, PyObject *text) {
    const unsigned char *d;
    Py_ssize_t n, i;
    if (!PyUnicode_CheckExact(s)) return 1;
    if (PyUnicode_IS_ASCII(s)) {
        d = PyUnicode_1BYTE_DATA(s);
        n = PyUnicode_GET_LENGTH(s);
        for (i = 0; i < n; i++)
            if (d[i] < 0x20 || d[i] == '"' || d[i] == '\\' || d[i] == 0x7f) break;
        if (i == n) {
            if (buf_grow(b, n + 2) < 0) return -1;
            b->p[b->n++] = '"';
            memcpy(b->p + b->n, d, (size_t)n);
            b->n += n;
            b->p[b->n++] = '"';
            return 0;
        }
    }
    return put_call(b, text, s) < 0 ? -1 : 0;
}

/* n >= 0 in decimal at tmp + len; the new length. */
static int put_digits(char *tmp, int len, long long n) {
    char rev[24];
    int i = 0;
    do {
        rev[i++] = (char)('0' + n % 10);
        n /= 10;
    } while (n > 0);
    while (i > 0) tmp[len++] = rev[--i];
    return len;
}

/* 0 written, 1 not taken (neither None nor a float), -1 error. round(x, 4) as orjson writes
 * it. Python rounds the exact binary value to 4 decimals (ties to even); here s = x * 1e4 is
 * off the exact product by at most half an ulp of s, under 2^-13 for |x| < 1e8, so its
 * nearest integer is the exact one unless s lies within 1e-3 of a half: those, and larger
 * values, go to the `number` callback. The double nearest to n / 1e4 prints as those digits
 * (shortest round trip: its neighbours 1e-4 apart cannot share a double below 1e8). */
static int put_ms(Buf *b, PyObject *v, PyObject *number) {
    double x, s, f, frac;
    long long n, ip;
    int fp, digits[4], last, i;
    char tmp[32];
    int len;
    if (v == Py_None) return PUT_LIT(b, "null");
    if (!PyFloat_CheckExact(v)) return 1;
    x = PyFloat_AS_DOUBLE(v);
    if (!isfinite(x)) return PUT_LIT(b, "null"); /* orjson writes NaN and infinities so */
    if (!(fabs(x) < 1e8)) return put_call(b, number, v) < 0 ? -1 : 0;
    s = x * 1e4;
    f = floor(s);
    frac = s - f;
    if (fabs(frac - 0.5) < 1e-3) return put_call(b, number, v) < 0 ? -1 : 0;
    n = (long long)(frac > 0.5 ? f + 1.0 : f);
    len = 0;
    if (n < 0 || (n == 0 && signbit(x))) tmp[len++] = '-';
    if (n < 0) n = -n;
    ip = n / 10000;
    fp = (int)(n % 10000);
    len = put_digits(tmp, len, ip);
    tmp[len++] = '.';
    digits[0] = fp / 1000;
    digits[1] = fp / 100 % 10;
    digits[2] = fp / 10 % 10;
    digits[3] = fp % 10;
    for (last = 3; last > 0 && digits[last] == 0; last--) {
    }
    for (i = 0; i <= last; i++) tmp[len++] = (char)('0' + digits[i]);
    return buf_put(b, tmp, len);
}

typedef struct {
    PyObject *loads;     /* orjson.loads */
    Py_ssize_t max_depth; /* jsonbody.MAX_DEPTH */
} Embedding;

/* A new reference to the JSON text of a result in an answer: the raw bytes themselves when
 * `loads` reads them and they open at most max_depth brackets and braces (so they cannot
 * nest deeper), else what `embed` (the Python rule, which then decides) gives. */
static PyObject *embedded(PyObject *raw, const Embedding *cfg, PyObject *embed) {
    const char *d = PyBytes_AS_STRING(raw);
    Py_ssize_t n = PyBytes_GET_SIZE(raw), i, opened = 0;
    PyObject *value = PyObject_CallOneArg(cfg->loads, raw);
    if (value == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError)) return NULL;
        PyErr_Clear(); /* not strict JSON: the Python rule reads it */
        return PyObject_CallOneArg(embed, raw);
    }
    Py_DECREF(value);
    for (i = 0; i < n; i++) opened += d[i] == '[' || d[i] == '{';
    if (opened > cfg->max_depth) return PyObject_CallOneArg(embed, raw);
    Py_INCREF(raw);
    return raw;
}

/* 0 written, 1 not taken, -1 error: one outcome's entry. */
static int put_entry(Buf *b, PyObject *o, PyObject *seen, const Embedding *cfg, PyObject *embed,
                     PyObject *text, PyObject *number) {
    PyObject *f[11];
    PyObject *json;
    int i, rc = 1;
    long long retries;
    char tmp[32];
    for (i = 0; i < 11; i++) f[i] = NULL;
    for (i = 0; i < 11; i++) {
        f[i] = PyObject_GetAttr(o, attr_names[i]);
        if (f[i] == NULL) {
            rc = -1;
            goto done;
        }
    }
    /* The types it writes; anything else is the caller's (before a byte is written). */
    if (!(f[6] == Py_None || f[6] == Py_True || f[6] == Py_False)) goto done;
    if (!(f[7] == Py_None || PyBytes_CheckExact(f[7]))) goto done;
    if (!(f[8] == Py_None || PyUnicode_CheckExact(f[8]))) goto done;
    if (!PyLong_CheckExact(f[10])) goto done;
    for (i = 2; i < 6; i++)
        if (!(f[i] == Py_None || PyFloat_CheckExact(f[i]))) goto done;
    if (!(f[9] == Py_None || PyFloat_CheckExact(f[9]))) goto done;
    if (!PyUnicode_CheckExact(f[0]) || !PyUnicode_CheckExact(f[1])) goto done;
    retries = PyLong_AsLongLong(f[10]);
    if (retries == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            rc = -1;
            goto done;
        }
        PyErr_Clear(); /* past 64 bits: orjson refuses it too, and Python says so */
        goto done;
    }
    rc = -1;
    if (PUT_LIT(b, "{\"server\":") < 0 || put_text(b, f[0], text) < 0) goto done;
    if (PUT_LIT(b, ",\"status\":") < 0 || put_text(b, f[1], text) < 0) goto done;
    if (PUT_LIT(b, ",\"queue_ms\":") < 0 || put_ms(b, f[2], number) < 0) goto done;
    if (PUT_LIT(b, ",\"service_ms\":") < 0 || put_ms(b, f[3], number) < 0) goto done;
    if (PUT_LIT(b, ",\"post_queue_ms\":") < 0 || put_ms(b, f[4], number) < 0) goto done;
    if (PUT_LIT(b, ",\"server_ms\":") < 0 || put_ms(b, f[5], number) < 0) goto done;
    if (PUT_LIT(b, ",\"missed_deadline\":") < 0) goto done;
    if ((f[6] == Py_None   ? PUT_LIT(b, "null")
         : f[6] == Py_True ? PUT_LIT(b, "true")
                           : PUT_LIT(b, "false")) < 0)
        goto done;
    if (PUT_LIT(b, ",\"result\":") < 0) goto done;
    if (f[7] == Py_None || PyBytes_GET_SIZE(f[7]) == 0) {
        if (PUT_LIT(b, "null") < 0) goto done;
    } else {
        json = PyDict_GetItemWithError(seen, f[7]); /* borrowed */
        if (json == NULL) {
            if (PyErr_Occurred()) goto done;
            json = embedded(f[7], cfg, embed);
            if (json == NULL) goto done;
            if (!PyBytes_Check(json)) {
                Py_DECREF(json);
                PyErr_SetString(PyExc_TypeError, "render_tasks: embed must return bytes");
                goto done;
            }
            if (PyDict_SetItem(seen, f[7], json) < 0) {
                Py_DECREF(json);
                goto done;
            }
            Py_DECREF(json); /* the dict holds it */
        }
        if (buf_put(b, PyBytes_AS_STRING(json), PyBytes_GET_SIZE(json)) < 0) goto done;
    }
    if (f[8] != Py_None) {
        if (PUT_LIT(b, ",\"error\":") < 0 || put_text(b, f[8], text) < 0) goto done;
    }
    if (f[9] != Py_None) {
        if (PUT_LIT(b, ",\"estimated_wait_ms\":") < 0 || put_ms(b, f[9], number) < 0) goto done;
    }
    if (retries != 0) {
        int len = snprintf(tmp, sizeof(tmp), ",\"retries\":%lld", retries);
        if (buf_put(b, tmp, len) < 0) goto done;
    }
    if (PUT_LIT(b, "}") < 0) goto done;
    rc = 0;
done:
    for (i = 0; i < 11; i++) Py_XDECREF(f[i]);
    return rc;
}

static PyObject *render_tasks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *outcomes, *seen, *out = NULL;
    Buf b = {NULL, 0, 0};
    Py_ssize_t n, i;
    Embedding cfg;
    int rc;
    (void)self;
    if (nargs != 6 || !PyList_CheckExact(args[0]) || !PyLong_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "render_tasks(outcomes: list, loads, max_depth: int, embed, text, number)");
        return NULL;
    }
    outcomes = args[0];
    cfg.loads = args[1];
    cfg.max_depth = PyLong_AsSsize_t(args[2]);
    if (cfg.max_depth == -1 && PyErr_Occurred()) return NULL;
    seen = PyDict_New();
    if (seen == NULL) return NULL;
    n = PyList_GET_SIZE(outcomes);
    if (buf_grow(&b, 2 + n * 220) < 0) goto fail;
    b.p[b.n++] = '[';
    for (i = 0; i < PyList_GET_SIZE(outcomes); i++) {
        PyObject *o = PyList_GET_ITEM(outcomes, i);
        if (i > 0 && PUT_LIT(&b, ",") < 0) goto fail;
        Py_INCREF(o); /* a callback may change the list */
        rc = put_entry(&b, o, seen, &cfg, args[3], args[4], args[5]);
        Py_DECREF(o);
        if (rc < 0) goto fail;
        if (rc > 0) {
            out = Py_None;
            Py_INCREF(out);
            goto fail;
        }
    }
    if (PUT_LIT(&b, "]") < 0) goto fail;
    out = PyBytes_FromStringAndSize(b.p, b.n);
fail:
    PyMem_Free(b.p);
    Py_DECREF(seen);
    return out;
}

/* ---------------------------------------------------------------- results in ------- */

/* settle(batch, now, central, note_tenants, server_id, pool, metrics, tenants, labels, ok,
 *        dropped, outcome_type) -> (statuses, post_queue, by_class, by_group) | None
 *
 * The twin of gateway/settle.py's settle_py (read it first): each (task, report) of a
 * frame of results into its query (run.complete), and the frame's counts. The rare parts
 * stay in Python, called from here in the same order as the twin calls them: a task's
 * wait-estimate error, its tenant's gate, a drop's module, its span. None, before anything
 * is changed, for a batch with a value of a type it does not read (the caller runs the
 * twin): a clock that is not a float, an entry that is not a (task, report) tuple, a
 * report that is not a 7-tuple with float durations, a task whose clocks are not floats. */

enum {
    S_RUN, S_INDEX, S_SENT, S_GQUEUE, S_PMISSED, S_EST, S_CLASS, S_FLOW, S_RETRIES, S_TRACE,
    S_PENDING, /* the fields above are PendingTask's */
    S_COMPLETE = S_PENDING, S_GROUP, S_WAIT_ERR, S_DROP, S_NOTE, S_END, S_NAMES
};
static PyObject *settle_names[S_NAMES];
static const char *settle_text[S_NAMES] = {
    "run", "index", "sent_s", "gateway_queue_ms", "missed_deadline", "est_wait_ms",
    "class_name", "flow", "retries", "trace", "complete", "group", "wait_estimate_error",
    "task_dropped", "note_task", "end",
};
static PyObject *end_kwnames; /* ("queue_ms", "service_ms", "missed", "error") */

typedef struct {
    PyObject *list; /* by_group's [ended, service ms summed, ran] of the current group */
    long long ended, ran;
    double sum;
} GroupSums;

static int group_flush(GroupSums *g) {
    PyObject *a, *b, *c;
    if (g->list == NULL) return 0;
    a = PyLong_FromLongLong(g->ended);
    b = PyFloat_FromDouble(g->sum);
    c = PyLong_FromLongLong(g->ran);
    if (a == NULL || b == NULL || c == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(c);
        return -1;
    }
    PyList_SetItem(g->list, 0, a); /* steals */
    PyList_SetItem(g->list, 1, b);
    PyList_SetItem(g->list, 2, c);
    g->list = NULL;
    return 0;
}

/* The group's sums into g (flushing the one before): the list's own values, so that a
 * group met again later in the frame goes on from where it was, as the twin's list does. */
static int group_open(GroupSums *g, PyObject *by_group, PyObject *group) {
    PyObject *list = PyDict_GetItemWithError(by_group, group);
    if (group_flush(g) < 0) return -1;
    if (list == NULL) {
        if (PyErr_Occurred()) return -1;
        list = Py_BuildValue("[ifi]", 0, 0.0, 0);
        if (list == NULL) return -1;
        if (PyDict_SetItem(by_group, group, list) < 0) {
            Py_DECREF(list);
            return -1;
        }
        Py_DECREF(list); /* by_group holds it */
    }
    g->list = list;
    g->ended = PyLong_AsLongLong(PyList_GET_ITEM(list, 0));
    g->sum = PyFloat_AsDouble(PyList_GET_ITEM(list, 1));
    g->ran = PyLong_AsLongLong(PyList_GET_ITEM(list, 2));
    return PyErr_Occurred() ? -1 : 0;
}

/* Where a slotted class (a dataclass with slots=True) keeps its fields: each one's offset,
 * read off its member descriptor, so that the fields of its instances are read and written
 * as the descriptor itself would, without looking the name up each time. `type` is NULL
 * where a field is not a plain object slot (then the names are looked up). */
typedef struct {
    PyTypeObject *type; /* a strong reference: the offsets stay its own */
    Py_ssize_t off[S_NAMES];
} Layout;

static Layout task_layout, outcome_layout;

static PyObject *post_init_name; /* "__post_init__" */

static void layout_of(Layout *l, PyTypeObject *t, PyObject *const *names, int n) {
    int k;
    Py_CLEAR(l->type);
    /* A dataclass that does more than assign its fields is built by its own __init__. */
    if (_PyType_Lookup(t, post_init_name) != NULL) return;
    for (k = 0; k < n; k++) {
        PyObject *d = _PyType_Lookup(t, names[k]);
        PyMemberDef *m;
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)) return;
        m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) return;
        l->off[k] = m->offset;
    }
    Py_INCREF(t);
    l->type = t;
}

/* o.<names[k]> as a new reference (NULL with AttributeError where it is unset). */
static PyObject *field(PyObject *o, const Layout *l, PyObject *const *names, int k) {
    PyObject *v;
    if (Py_TYPE(o) != l->type) return PyObject_GetAttr(o, names[k]);
    v = *(PyObject **)((char *)o + l->off[k]);
    if (v == NULL) return PyObject_GetAttr(o, names[k]); /* raises as Python would */
    Py_INCREF(v);
    return v;
}

static int float_attr(PyObject *o, int k, double *out) {
    PyObject *v = field(o, &task_layout, settle_names, k);
    int ok;
    if (v == NULL) {
        PyErr_Clear();
        return 0;
    }
    ok = PyFloat_CheckExact(v);
    if (ok) *out = PyFloat_AS_DOUBLE(v);
    Py_DECREF(v);
    return ok;
}

static int count_add(PyObject *d, PyObject *key, long long n) {
    PyObject *old = PyDict_GetItemWithError(d, key), *v;
    int rc;
    if (old == NULL && PyErr_Occurred()) return -1;
    v = PyLong_FromLongLong((old == NULL ? 0 : PyLong_AsLongLong(old)) + n);
    if (v == NULL) return -1;
    rc = PyDict_SetItem(d, key, v);
    Py_DECREF(v);
    return rc;
}

/* A TaskOutcome with these fields, in its order: what its dataclass __init__ does (it only
 * assigns them), without the call into Python. A type whose fields are not all object
 * slots is called. */
static PyObject *new_outcome(PyObject *type, PyObject *const *fields) {
    PyTypeObject *t = (PyTypeObject *)type;
    PyObject *o;
    int k;
    if (!PyType_Check(type)) return PyObject_Vectorcall(type, fields, 11, NULL);
    if (outcome_layout.type != t) layout_of(&outcome_layout, t, attr_names, 11);
    if (outcome_layout.type != t) return PyObject_Vectorcall(type, fields, 11, NULL);
    o = t->tp_alloc(t, 0);
    if (o == NULL) return NULL;
    for (k = 0; k < 11; k++) {
        Py_INCREF(fields[k]);
        *(PyObject **)((char *)o + outcome_layout.off[k]) = fields[k];
    }
    return o;
}

/* QueryRun.complete(index, outcome, now), inlined for a QueryRun itself (settle's optional
 * last argument names the class, its `complete` function and the OK status): the same
 * changes in the same order, its future's done() and set_result(None) called as it calls
 * them. 1: done here; 0: not inlined, nothing changed (another class, a replaced `complete`,
 * a field unset or of another type, an index outside the list: the caller calls the method,
 * which raises where Python raises); -1: an error. */
enum { R_OUTCOMES, R_REMAINING, R_FAILED, R_DONE, R_T_LAST, R_NAMES };
static PyObject *run_names[R_NAMES];
static const char *run_text[R_NAMES] = {"outcomes", "remaining", "failed", "done", "t_last"};
static PyObject *done_name, *set_result_name; /* "done", "set_result" */
static Layout run_layout;

#define RUN_SLOT(o, k) (*(PyObject **)((char *)(o) + run_layout.off[k]))

/* A field deleted by what a comparison or a truth test ran: raise as reading it would. */
static int run_unset(int k) {
    PyErr_Format(PyExc_AttributeError, "'QueryRun' object has no attribute '%s'", run_text[k]);
    return -1;
}

static int complete_inline(PyObject *inl, PyObject *run, PyObject *index, PyObject *outcome,
                           PyObject *now) {
    PyTypeObject *t;
    PyObject *outcomes, *remaining, *tmp, *future;
    Py_ssize_t i;
    long long rem;
    int ne, failed, finished;
    if (inl == NULL) return 0;
    t = (PyTypeObject *)PyTuple_GET_ITEM(inl, 0);
    if (Py_TYPE(run) != t) return 0;
    if (run_layout.type != t) layout_of(&run_layout, t, run_names, R_NAMES);
    if (run_layout.type != t) return 0;
    if (_PyType_Lookup(t, settle_names[S_COMPLETE]) != PyTuple_GET_ITEM(inl, 1)) return 0;
    outcomes = RUN_SLOT(run, R_OUTCOMES);
    remaining = RUN_SLOT(run, R_REMAINING);
    if (outcomes == NULL || remaining == NULL || RUN_SLOT(run, R_FAILED) == NULL ||
        RUN_SLOT(run, R_DONE) == NULL || !PyList_CheckExact(outcomes) ||
        !PyLong_CheckExact(remaining) || !PyLong_CheckExact(index))
        return 0;
    i = PyLong_AsSsize_t(index);
    rem = PyLong_AsLongLong(remaining);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (i < 0 || i >= PyList_GET_SIZE(outcomes)) return 0;
    /* if self.outcomes[index] is not None: return */
    if (PyList_GET_ITEM(outcomes, i) != Py_None) return 1;
    /* self.outcomes[index] = outcome; self.remaining -= 1 */
    Py_INCREF(outcome);
    PyList_SetItem(outcomes, i, outcome);
    tmp = PyLong_FromLongLong(rem - 1);
    if (tmp == NULL) return -1;
    Py_XSETREF(RUN_SLOT(run, R_REMAINING), tmp);
    /* if outcome.status != OK: self.failed = True (the outcome's own field, as it reads) */
    tmp = field(outcome, &outcome_layout, attr_names, 1);
    if (tmp == NULL) return -1;
    ne = PyObject_RichCompareBool(tmp, PyTuple_GET_ITEM(inl, 2), Py_NE);
    Py_DECREF(tmp);
    if (ne < 0) return -1;
    if (ne) Py_XSETREF(RUN_SLOT(run, R_FAILED), Py_NewRef(Py_True));
    /* if (self.failed or self.remaining == 0) and not self.done.done(): (each field held
     * while it is used: what a truth test or a method runs cannot free it under us) */
    tmp = RUN_SLOT(run, R_FAILED);
    if (tmp == NULL) return run_unset(R_FAILED);
    Py_INCREF(tmp);
    failed = PyObject_IsTrue(tmp);
    Py_DECREF(tmp);
    if (failed < 0) return -1;
    if (!failed && rem - 1 != 0) return 1;
    if (RUN_SLOT(run, R_DONE) == NULL) return run_unset(R_DONE);
    future = Py_NewRef(RUN_SLOT(run, R_DONE));
    tmp = PyObject_CallMethodNoArgs(future, done_name);
    Py_DECREF(future);
    if (tmp == NULL) return -1;
    finished = PyObject_IsTrue(tmp);
    Py_DECREF(tmp);
    if (finished < 0) return -1;
    if (finished) return 1;
    /* self.t_last = now; self.done.set_result(None) */
    Py_XSETREF(RUN_SLOT(run, R_T_LAST), Py_NewRef(now));
    if (RUN_SLOT(run, R_DONE) == NULL) return run_unset(R_DONE);
    future = Py_NewRef(RUN_SLOT(run, R_DONE));
    tmp = PyObject_CallMethodOneArg(future, set_result_name, Py_None);
    Py_DECREF(future);
    if (tmp == NULL) return -1;
    Py_DECREF(tmp);
    return 1;
}

typedef struct {
    PyObject *const *args; /* settle's own */
    PyObject *inline_complete; /* (QueryRun, QueryRun.complete, OK) or NULL */
    int central, note_tenants;
    double now;
    PyObject *statuses, *post_queue, *by_class, *by_group, *last_group;
    GroupSums g;
} Frame;

static PyObject *settle_one(Frame *f, PyObject *p, PyObject *r, double sent, double gq) {
    PyObject *const *args = f->args;
    int central = f->central;
    double now = f->now;
    PyObject *statuses = f->statuses, *post_queue = f->post_queue, *by_class = f->by_class;
    GroupSums *g = &f->g;
    PyObject *server_id = args[4], *pool = args[5], *metrics = args[6], *tenants = args[7];
    PyObject *labels = args[8], *ok = args[9], *dropped = args[10], *outcome_type = args[11];
    PyObject *code = PyTuple_GET_ITEM(r, 0), *r_queue = PyTuple_GET_ITEM(r, 1);
    PyObject *service = PyTuple_GET_ITEM(r, 2), *result = PyTuple_GET_ITEM(r, 5);
    PyObject *error = PyTuple_GET_ITEM(r, 6);
    double r_queue_ms = PyFloat_AS_DOUBLE(r_queue), service_ms = PyFloat_AS_DOUBLE(service);
    double server_ms = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(r, 3));
    double post_queue_ms, queue_ms, net_ms;
    PyObject *status, *est = NULL, *retries = NULL, *trace = NULL, *outcome = NULL;
    PyObject *run = NULL, *index = NULL, *group = NULL, *tmp = NULL, *missed_o;
    PyObject *pq = NULL, *qm = NULL, *cls = NULL, *res = NULL;
    Py_ssize_t label_i;
    int missed, ran = code == ok;

    label_i = PyNumber_AsSsize_t(code, PyExc_IndexError);
    if (label_i == -1 && PyErr_Occurred()) return NULL;
    status = PySequence_GetItem(labels, label_i);
    if (status == NULL) return NULL;
    if (central) {
        /* The dequeue happened here, when the task was sent (TailGuard §III.C.2). */
        post_queue_ms = (now - sent) * 1000.0;
        queue_ms = gq + r_queue_ms;
        tmp = field(p, &task_layout, settle_names, S_PMISSED);
        if (tmp == NULL) goto done;
        missed = PyObject_IsTrue(tmp);
        Py_CLEAR(tmp);
    } else {
        /* No shared clock: the round trip split into server time and network time. */
        net_ms = (now - sent) * 1000.0 - server_ms;
        if (net_ms < 0.0) net_ms = 0.0;
        post_queue_ms = (server_ms - r_queue_ms) + net_ms / 2.0;
        queue_ms = r_queue_ms + net_ms / 2.0;
        missed = PyObject_IsTrue(PyTuple_GET_ITEM(r, 4));
    }
    if (missed < 0) goto done;
    missed_o = missed ? Py_True : Py_False;
    if (count_add(statuses, status, 1) < 0) goto done;
    pq = PyFloat_FromDouble(post_queue_ms);
    qm = PyFloat_FromDouble(queue_ms);
    est = field(p, &task_layout, settle_names, S_EST);
    if (pq == NULL || qm == NULL || est == NULL) goto done;
    if (ran) {
        PyObject *counts;
        if (est != Py_None) {
            PyObject *call[4] = {metrics, pool, central ? qm : r_queue, est};
            tmp = PyObject_VectorcallMethod(settle_names[S_WAIT_ERR], call,
                                            4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (tmp == NULL) goto done;
            Py_CLEAR(tmp);
        }
        if (PyList_Append(post_queue, pq) < 0) goto done;
        cls = field(p, &task_layout, settle_names, S_CLASS);
        if (cls == NULL) goto done;
        counts = PyDict_GetItemWithError(by_class, cls);
        if (counts == NULL) {
            if (PyErr_Occurred()) goto done;
            counts = Py_BuildValue("[ii]", missed, 1);
            if (counts == NULL || PyDict_SetItem(by_class, cls, counts) < 0) {
                Py_XDECREF(counts);
                goto done;
            }
            Py_DECREF(counts);
        } else {
            long long m = PyLong_AsLongLong(PyList_GET_ITEM(counts, 0));
            long long n = PyLong_AsLongLong(PyList_GET_ITEM(counts, 1));
            PyObject *a, *b;
            if (PyErr_Occurred()) goto done;
            a = PyLong_FromLongLong(m + missed);
            b = PyLong_FromLongLong(n + 1);
            if (a == NULL || b == NULL) {
                Py_XDECREF(a);
                Py_XDECREF(b);
                goto done;
            }
            PyList_SetItem(counts, 0, a);
            PyList_SetItem(counts, 1, b);
        }
        if (f->note_tenants) {
            PyObject *flow = field(p, &task_layout, settle_names, S_FLOW), *call[4];
            if (flow == NULL) goto done;
            call[0] = tenants;
            call[1] = flow;
            call[2] = missed_o;
            call[3] = cls;
            tmp = PyObject_VectorcallMethod(settle_names[S_NOTE], call,
                                            4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            Py_DECREF(flow);
            if (tmp == NULL) goto done;
            Py_CLEAR(tmp);
        }
    } else if (code == dropped) {
        PyObject *call[3] = {metrics, pool, error};
        tmp = PyObject_VectorcallMethod(settle_names[S_DROP], call,
                                        3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (tmp == NULL) goto done;
        Py_CLEAR(tmp);
    }
    retries = field(p, &task_layout, settle_names, S_RETRIES);
    if (retries == NULL) goto done;
    {
        PyObject *fields[11] = {server_id, status, qm, service, pq,
                                PyTuple_GET_ITEM(r, 3), missed_o, result, error, est, retries};
        outcome = new_outcome(outcome_type, fields);
        if (outcome == NULL) goto done;
    }
    trace = field(p, &task_layout, settle_names, S_TRACE);
    if (trace == NULL) goto done;
    if (trace != Py_None) {
        PyObject *call[8] = {trace, status, server_id, retries, qm, service, missed_o, error};
        tmp = PyObject_VectorcallMethod(settle_names[S_END], call,
                                        4 | PY_VECTORCALL_ARGUMENTS_OFFSET, end_kwnames);
        if (tmp == NULL) goto done;
        Py_CLEAR(tmp);
    }
    run = field(p, &task_layout, settle_names, S_RUN);
    index = field(p, &task_layout, settle_names, S_INDEX);
    if (run == NULL || index == NULL) goto done;
    {
        int inlined = complete_inline(f->inline_complete, run, index, outcome, args[1]);
        if (inlined < 0) goto done;
        if (!inlined) {
            PyObject *call[4] = {run, index, outcome, args[1]};
            tmp = PyObject_VectorcallMethod(settle_names[S_COMPLETE], call,
                                            4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (tmp == NULL) goto done;
            Py_CLEAR(tmp);
        }
    }
    group = PyObject_GetAttr(run, settle_names[S_GROUP]);
    if (group == NULL) goto done;
    if (group != Py_None) {
        /* The tasks of a frame are mostly of one group: its sums stay here meanwhile. */
        int other = f->last_group == NULL
                        ? 1
                        : PyObject_RichCompareBool(group, f->last_group, Py_NE);
        if (other < 0) goto done;
        if (other) {
            if (group_open(g, f->by_group, group) < 0) goto done;
            Py_INCREF(group);
            Py_XSETREF(f->last_group, group);
        }
        g->ended += 1;
        if (ran && 0.0 <= service_ms && service_ms < INFINITY) {
            g->sum += service_ms;
            g->ran += 1;
        }
    }
    res = Py_None;
    Py_INCREF(res);
done:
    Py_DECREF(status);
    Py_XDECREF(pq);
    Py_XDECREF(qm);
    Py_XDECREF(est);
    Py_XDECREF(cls);
    Py_XDECREF(retries);
    Py_XDECREF(outcome);
    Py_XDECREF(trace);
    Py_XDECREF(run);
    Py_XDECREF(index);
    Py_XDECREF(group);
    Py_XDECREF(tmp);
    return res;
}

static PyObject *settle(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *batch, *out = NULL;
    double *clocks = NULL;
    Py_ssize_t n, i;
    Frame f = {args, NULL, 0, 0, 0.0, NULL, NULL, NULL, NULL, NULL, {NULL, 0, 0, 0.0}};
    (void)self;
    if (nargs != 12 && nargs != 13) {
        PyErr_SetString(PyExc_TypeError,
                        "settle(batch, now, central, note_tenants, server_id, pool, metrics, "
                        "tenants, labels, ok, dropped, outcome_type[, run_inline])");
        return NULL;
    }
    if (nargs == 13) {
        PyObject *inl = args[12];
        if (!PyTuple_CheckExact(inl) || PyTuple_GET_SIZE(inl) != 3 ||
            !PyType_Check(PyTuple_GET_ITEM(inl, 0))) {
            PyErr_SetString(PyExc_TypeError,
                            "settle: run_inline is (QueryRun, QueryRun.complete, OK)");
            return NULL;
        }
        f.inline_complete = inl;
    }
    if (!PyFloat_CheckExact(args[1]) || !PyList_CheckExact(args[0])) Py_RETURN_NONE;
    f.now = PyFloat_AS_DOUBLE(args[1]);
    if ((f.central = PyObject_IsTrue(args[2])) < 0) return NULL;
    if ((f.note_tenants = PyObject_IsTrue(args[3])) < 0) return NULL;
    /* A copy: a callback may change the caller's list, never what this frame settles. */
    batch = PyList_GetSlice(args[0], 0, PyList_GET_SIZE(args[0]));
    if (batch == NULL) return NULL;
    n = PyList_GET_SIZE(batch);
    clocks = PyMem_Malloc(sizeof(double) * (size_t)(2 * n + 1));
    if (clocks == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    if (n > 0) {
        PyObject *e = PyList_GET_ITEM(batch, 0);
        if (PyTuple_CheckExact(e) && PyTuple_GET_SIZE(e) == 2) {
            PyTypeObject *t = Py_TYPE(PyTuple_GET_ITEM(e, 0));
            if (task_layout.type != t) layout_of(&task_layout, t, settle_names, S_PENDING);
        }
    }
    /* First, with nothing changed: is every value one this reads? */
    for (i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(batch, i), *r;
        int k;
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 2) goto decline;
        r = PyTuple_GET_ITEM(e, 1);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != REPORT_FIELDS) goto decline;
        for (k = 1; k <= 3; k++)
            if (!PyFloat_CheckExact(PyTuple_GET_ITEM(r, k))) goto decline;
        if (!float_attr(PyTuple_GET_ITEM(e, 0), S_SENT, &clocks[2 * i]))
            goto decline;
        clocks[2 * i + 1] = 0.0;
        if (f.central && !float_attr(PyTuple_GET_ITEM(e, 0), S_GQUEUE,
                                     &clocks[2 * i + 1]))
            goto decline;
    }
    f.statuses = PyDict_New();
    f.post_queue = PyList_New(0);
    f.by_class = PyDict_New();
    f.by_group = PyDict_New();
    if (f.statuses == NULL || f.post_queue == NULL || f.by_class == NULL || f.by_group == NULL)
        goto fail;
    for (i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(batch, i);
        PyObject *rc = settle_one(&f, PyTuple_GET_ITEM(e, 0), PyTuple_GET_ITEM(e, 1),
                                  clocks[2 * i], clocks[2 * i + 1]);
        if (rc == NULL) goto fail;
        Py_DECREF(rc);
    }
    if (group_flush(&f.g) < 0) goto fail;
    out = PyTuple_Pack(4, f.statuses, f.post_queue, f.by_class, f.by_group);
    goto fail;
decline:
    out = Py_None;
    Py_INCREF(out);
fail:
    PyMem_Free(clocks);
    Py_DECREF(batch);
    Py_XDECREF(f.statuses);
    Py_XDECREF(f.post_queue);
    Py_XDECREF(f.by_class);
    Py_XDECREF(f.by_group);
    Py_XDECREF(f.last_group);
    return out;
}

/* take(items, outstanding, rejected) -> (batch, refused) | None: the twin of
 * gateway/settle.py's take_py. The (task, report) of each decoded result whose task is
 * outstanding (its query id maps to a task of that index), taken out of `outstanding`, in
 * order; `refused`: whether a report's status is `rejected`. None, with nothing taken, for
 * an item that is not a (str, int, tuple) tuple. */
static PyObject *take_results(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *items, *outstanding, *batch, *out = NULL;
    Py_ssize_t n, i;
    int refused = 0;
    (void)self;
    if (nargs != 3 || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "take(items, outstanding: dict, rejected)");
        return NULL;
    }
    items = args[0];
    outstanding = args[1];
    if (!PyList_CheckExact(items)) Py_RETURN_NONE;
    n = PyList_GET_SIZE(items);
    for (i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(items, i);
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 3 ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(e, 0)) ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(e, 1)) || !PyTuple_Check(PyTuple_GET_ITEM(e, 2)) ||
            PyTuple_GET_SIZE(PyTuple_GET_ITEM(e, 2)) < 1)
            Py_RETURN_NONE;
    }
    batch = PyList_New(0);
    if (batch == NULL) return NULL;
    for (i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(items, i), *qid = PyTuple_GET_ITEM(e, 0);
        PyObject *report = PyTuple_GET_ITEM(e, 2), *p, *index, *pair;
        int other;
        p = PyDict_GetItemWithError(outstanding, qid);
        if (p == NULL) {
            if (PyErr_Occurred()) goto fail;
            continue; /* the query already ended (failed, timed out, or cancelled) */
        }
        Py_INCREF(p);
        if (task_layout.type != Py_TYPE(p))
            layout_of(&task_layout, Py_TYPE(p), settle_names, S_PENDING);
        index = field(p, &task_layout, settle_names, S_INDEX);
        if (index == NULL) {
            Py_DECREF(p);
            goto fail;
        }
        other = PyObject_RichCompareBool(index, PyTuple_GET_ITEM(e, 1), Py_NE);
        Py_DECREF(index);
        if (other != 0) {
            Py_DECREF(p);
            if (other < 0) goto fail;
            continue;
        }
        if (PyDict_DelItem(outstanding, qid) < 0) {
            Py_DECREF(p);
            goto fail;
        }
        if (PyTuple_GET_ITEM(report, 0) == args[2]) refused = 1;
        pair = PyTuple_Pack(2, p, report);
        Py_DECREF(p);
        if (pair == NULL || PyList_Append(batch, pair) < 0) {
            Py_XDECREF(pair);
            goto fail;
        }
        Py_DECREF(pair);
    }
    out = Py_BuildValue("(OO)", batch, refused ? Py_True : Py_False);
fail:
    Py_DECREF(batch);
    return out;
}

/* new_tasks(type, names, template, links, waits) -> [type instance per link] | None
 *
 * The PendingTasks of one query, one per link, as its dataclass __init__ would build them
 * (it only assigns its fields): each field names[k] set to template[k], except the first
 * three, "index", "server_id" and "est_wait_ms", which are the task's position, its link's
 * `server_id`, and `waits[i].mean_ms` (None where `waits` is None). The caller
 * (gateway/tasks.py) builds the template from the dataclass's own fields and defaults; its
 * twin there calls the class. None, before anything is built, for a type whose fields are
 * not all plain object slots or which has a __post_init__ (the caller builds them). */

#define TASK_FIELDS_MAX 32

static struct {
    PyTypeObject *type; /* a strong reference, as Layout's */
    PyObject *names;    /* the names tuple the offsets were read for (a strong reference) */
    Py_ssize_t n, off[TASK_FIELDS_MAX];
} build_layout;

static PyObject *server_id_name, *mean_ms_name; /* "server_id", "mean_ms" */

static int build_layout_of(PyTypeObject *t, PyObject *names) {
    Py_ssize_t n = PyTuple_GET_SIZE(names), k;
    if (build_layout.type == t && build_layout.names == names) return 1;
    Py_CLEAR(build_layout.type);
    Py_CLEAR(build_layout.names);
    if (n < 3 || n > TASK_FIELDS_MAX || _PyType_Lookup(t, post_init_name) != NULL) return 0;
    for (k = 0; k < n; k++) {
        PyObject *name = PyTuple_GET_ITEM(names, k), *d;
        PyMemberDef *m;
        if (!PyUnicode_Check(name)) return 0;
        d = _PyType_Lookup(t, name);
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)) return 0;
        m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) return 0;
        build_layout.off[k] = m->offset;
    }
    build_layout.n = n;
    Py_INCREF(t);
    build_layout.type = t;
    Py_INCREF(names);
    build_layout.names = names;
    return 1;
}

static PyObject *new_tasks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *type, *names, *template, *links, *waits, *out;
    PyTypeObject *t;
    Py_ssize_t n, i, k, nf;
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "new_tasks takes 5 arguments");
        return NULL;
    }
    type = args[0], names = args[1], template = args[2], links = args[3], waits = args[4];
    if (!PyType_Check(type) || !PyTuple_Check(names) || !PyTuple_Check(template) ||
        !PyList_Check(links) || (waits != Py_None && !PyList_Check(waits))) {
        PyErr_SetString(PyExc_TypeError,
                        "new_tasks(type, names: tuple, template: tuple, links: list, "
                        "waits: list | None)");
        return NULL;
    }
    nf = PyTuple_GET_SIZE(names);
    n = PyList_GET_SIZE(links);
    if (PyTuple_GET_SIZE(template) != nf) {
        PyErr_SetString(PyExc_ValueError, "new_tasks: names and template differ in length");
        return NULL;
    }
    if (waits != Py_None && PyList_GET_SIZE(waits) != n) {
        PyErr_SetString(PyExc_ValueError, "new_tasks: waits and links differ in length");
        return NULL;
    }
    t = (PyTypeObject *)type;
    if (!build_layout_of(t, names)) Py_RETURN_NONE;
    out = PyList_New(n);
    if (out == NULL) return NULL;
    for (i = 0; i < n; i++) {
        PyObject *o, *v[3];
        v[0] = PyLong_FromSsize_t(i);
        v[1] = PyObject_GetAttr(PyList_GET_ITEM(links, i), server_id_name);
        v[2] = waits == Py_None ? Py_NewRef(Py_None)
                                : PyObject_GetAttr(PyList_GET_ITEM(waits, i), mean_ms_name);
        o = (v[0] && v[1] && v[2]) ? t->tp_alloc(t, 0) : NULL;
        if (o == NULL) {
            Py_XDECREF(v[0]);
            Py_XDECREF(v[1]);
            Py_XDECREF(v[2]);
            Py_DECREF(out);
            return NULL;
        }
        for (k = 0; k < nf; k++) {
            /* the three set per task are handed over; the template's shared */
            PyObject *val = k < 3 ? v[k] : Py_NewRef(PyTuple_GET_ITEM(template, k));
            *(PyObject **)((char *)o + build_layout.off[k]) = val;
        }
        PyList_SET_ITEM(out, i, o);
    }
    return out;
}

/* sample(getrandbits, population, k) -> list
 *
 * random.Random.sample(population, k) for a list, the same draws in the same order, given
 * the bound getrandbits of the random.Random it would run on (CPython's Lib/random.py:
 * `_randbelow_with_getrandbits`, and sample's two branches, a pool of the population or a
 * set of the indices drawn, chosen by its rule). The caller (gateway/tasks.py) passes only
 * a random.Random itself, whose _randbelow is that one; the tests compare the two draw for
 * draw. */

static int randbelow(PyObject *getrandbits, PyObject *const *bits_of, unsigned long long m,
                     unsigned long long *out) {
    int bits = 0;
    unsigned long long r;
    while (bits < 64 && (m >> bits) != 0) bits++; /* m.bit_length() */
    for (;;) {
        PyObject *v = PyObject_CallOneArg(getrandbits, bits_of[bits]);
        if (v == NULL) return -1;
        r = PyLong_AsUnsignedLongLong(v);
        Py_DECREF(v);
        if (r == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        if (r < m) break;
    }
    *out = r;
    return 0;
}

static PyObject *bits_objects[65]; /* 0..64 as ints, for getrandbits */

static PyObject *sample(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *getrandbits, *population, *result, **pool = NULL;
    Py_ssize_t n, k, i, setsize;
    unsigned long long j;
    (void)self;
    if (nargs != 3 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "sample(getrandbits, population: list, k: int)");
        return NULL;
    }
    getrandbits = args[0], population = args[1];
    k = PyLong_AsSsize_t(args[2]);
    if (k == -1 && PyErr_Occurred()) return NULL;
    n = PyList_GET_SIZE(population);
    if (!(0 <= k && k <= n)) {
        PyErr_SetString(PyExc_ValueError, "Sample larger than population or is negative");
        return NULL;
    }
    setsize = 21;
    if (k > 5) {
        /* 4 ** ceil(log(3k, 4)), log(x, base) as math.log computes it: log(x) / log(base) */
        double e = ceil(log((double)(k * 3)) / log(4.0));
        if (e >= 31) {
            setsize = PY_SSIZE_T_MAX; /* beyond any list's length */
        } else {
            setsize += (Py_ssize_t)1 << (2 * (int)e);
        }
    }
    result = PyList_New(k);
    if (result == NULL) return NULL;
    if (n <= setsize) {
        /* An n-length list is smaller than a k-length set; non-selected at pool[0 : n-i]. */
        pool = PyMem_Malloc(sizeof(PyObject *) * (size_t)(n ? n : 1));
        if (pool == NULL) {
            Py_DECREF(result);
            return PyErr_NoMemory();
        }
        /* list(population): references of its own, whatever getrandbits does to the list */
        for (i = 0; i < n; i++) pool[i] = Py_NewRef(PyList_GET_ITEM(population, i));
        for (i = 0; i < k; i++) {
            if (randbelow(getrandbits, bits_objects, (unsigned long long)(n - i), &j) < 0)
                goto fail;
            PyList_SET_ITEM(result, i, pool[j]); /* pool's reference, handed over */
            pool[j] = pool[n - i - 1];
        }
        for (i = 0; i < n - k; i++) Py_DECREF(pool[i]); /* the ones not drawn */
        PyMem_Free(pool);
        return result;
    } else {
        unsigned char *selected = PyMem_Calloc((size_t)n, 1);
        if (selected == NULL) {
            Py_DECREF(result);
            return PyErr_NoMemory();
        }
        for (i = 0; i < k; i++) {
            do {
                if (randbelow(getrandbits, bits_objects, (unsigned long long)n, &j) < 0) {
                    PyMem_Free(selected);
                    Py_DECREF(result);
                    return NULL;
                }
            } while (selected[j]);
            selected[j] = 1;
            if ((Py_ssize_t)j >= PyList_GET_SIZE(population)) {
                PyMem_Free(selected);
                Py_DECREF(result);
                PyErr_SetString(PyExc_RuntimeError, "sample: the population changed size");
                return NULL;
            }
            PyList_SET_ITEM(result, i, Py_NewRef(PyList_GET_ITEM(population, j)));
        }
        PyMem_Free(selected);
        return result;
    }
fail:
    /* the drawn ones are result's (items i.. of it still NULL); pool[0 : n-i] are pool's */
    for (k = 0; k < n - i; k++) Py_DECREF(pool[k]);
    PyMem_Free(pool);
    Py_DECREF(result);
    return NULL;
}

static PyMethodDef methods[] = {
    {"new_tasks", (PyCFunction)(void (*)(void))new_tasks, METH_FASTCALL,
     "new_tasks(type, names, template, links, waits) -> a query's tasks, one per link, or "
     "None for a type left to the caller"},
    {"sample", (PyCFunction)(void (*)(void))sample, METH_FASTCALL,
     "sample(getrandbits, population, k) -> random.Random.sample(population, k), the same "
     "draws, given the bound getrandbits of that random.Random"},
    {"take", (PyCFunction)(void (*)(void))take_results, METH_FASTCALL,
     "take(items, outstanding, rejected) -> (batch, refused), or None for items left to the "
     "caller"},
    {"settle", (PyCFunction)(void (*)(void))settle, METH_FASTCALL,
     "settle(batch, now, central, note_tenants, server_id, pool, metrics, tenants, labels, ok, "
     "dropped, outcome_type[, run_inline]) -> (statuses, post_queue, by_class, by_group), or "
     "None for a batch left to the caller"},
    {"render_tasks", (PyCFunction)(void (*)(void))render_tasks, METH_FASTCALL,
     "render_tasks(outcomes, loads, max_depth, embed, text, number) -> the answer's tasks "
     "array as JSON bytes, "
     "or None for an outcome left to the caller"},
    {"crossing", (PyCFunction)(void (*)(void))crossing, METH_FASTCALL,
     "crossing(matrix, rows, level) -> (first point whose sum over the rows is >= level, "
     "the sum before it, the sum at it)"},
    {"search", (PyCFunction)(void (*)(void))search, METH_FASTCALL,
     "search(coarse, blocks, rows, level, threshold) -> None if the rows are one row, else "
     "(cell, step, sum before, sum at, least threshold)"},
    {"probe", (PyCFunction)(void (*)(void))probe, METH_FASTCALL,
     "probe(matrix, rows, point) -> the sum over the rows at that point"},
    {"encode_tasks", (PyCFunction)(void (*)(void))encode_tasks, METH_FASTCALL,
     "encode_tasks(items, max_batch_bytes) -> framed submit/submit_batch messages"},
    {"decode_results", (PyCFunction)(void (*)(void))decode_results, METH_FASTCALL,
     "decode_results(frame, max_string, max_items, max_depth, max_duration_ms, report_type, "
     "statuses) -> list of result tuples, or None for a frame left to the general decoder"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hotpath", "Task and result frames of the gateway (C).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hotpath(void) {
    PyObject *m;
    int i;
    for (i = 0; i < 11; i++) {
        if (attr_names[i] == NULL) attr_names[i] = PyUnicode_InternFromString(attr_text[i]);
        if (attr_names[i] == NULL) return NULL;
    }
    for (i = 0; i < S_NAMES; i++) {
        if (settle_names[i] == NULL) settle_names[i] = PyUnicode_InternFromString(settle_text[i]);
        if (settle_names[i] == NULL) return NULL;
    }
    if (post_init_name == NULL) post_init_name = PyUnicode_InternFromString("__post_init__");
    if (post_init_name == NULL) return NULL;
    if (end_kwnames == NULL)
        end_kwnames = Py_BuildValue("(ssss)", "queue_ms", "service_ms", "missed", "error");
    if (end_kwnames == NULL) return NULL;
    for (i = 0; i < R_NAMES; i++) {
        if (run_names[i] == NULL) run_names[i] = PyUnicode_InternFromString(run_text[i]);
        if (run_names[i] == NULL) return NULL;
    }
    if (done_name == NULL) done_name = PyUnicode_InternFromString("done");
    if (set_result_name == NULL) set_result_name = PyUnicode_InternFromString("set_result");
    if (done_name == NULL || set_result_name == NULL) return NULL;
    if (server_id_name == NULL) server_id_name = PyUnicode_InternFromString("server_id");
    if (mean_ms_name == NULL) mean_ms_name = PyUnicode_InternFromString("mean_ms");
    if (server_id_name == NULL || mean_ms_name == NULL) return NULL;
    for (i = 0; i <= 64; i++) {
        if (bits_objects[i] == NULL) bits_objects[i] = PyLong_FromLong(i);
        if (bits_objects[i] == NULL) return NULL;
    }
    if (PyType_Ready(&SlotIndexType) < 0) return NULL;
    m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&SlotIndexType);
    if (PyModule_AddObject(m, "SlotIndex", (PyObject *)&SlotIndexType) < 0) {
        Py_DECREF(&SlotIndexType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
