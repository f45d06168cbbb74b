/* Which code objects ran: a C profile hook for Python < 3.12 (select/watch.py, NativeHook).
 *
 * cProfile answers the same question but times every call and keeps a tree of callers,
 * which doubles the cost of a call-heavy test on 3.11. This hook only puts the code object
 * in a pointer set, and in a second set while a module's top-level code is running (an
 * import: what it runs counts for every later test). The sets hold strong references,
 * so a pointer is never reused while it is in a set. Every function runs with the GIL. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>

typedef struct {
    PyObject **slots; /* NULL or a code object with a reference held */
    Py_ssize_t size;  /* a power of two, or 0 before the first insert */
    Py_ssize_t used;
} CodeSet;

static CodeSet seen, imported;
static long importing;   /* module bodies running, in every thread together */
static int out_of_memory; /* a code object could not be noted since the last take */
static PyObject *hook;   /* what sys.getprofile() returns while this hook is set */

static Py_ssize_t
slot_of(PyObject **slots, Py_ssize_t size, PyObject *code)
{
    size_t mask = (size_t)size - 1;
    size_t i = ((size_t)code >> 4) & mask;
    while (slots[i] != NULL && slots[i] != code) {
        i = (i + 1) & mask;
    }
    return (Py_ssize_t)i;
}

static int
grow(CodeSet *set)
{
    Py_ssize_t size = set->size ? set->size * 2 : 256;
    PyObject **slots = PyMem_Calloc((size_t)size, sizeof(PyObject *));
    if (slots == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < set->size; i++) {
        if (set->slots[i] != NULL) {
            slots[slot_of(slots, size, set->slots[i])] = set->slots[i];
        }
    }
    PyMem_Free(set->slots);
    set->slots = slots;
    set->size = size;
    return 0;
}

static void
note(CodeSet *set, PyObject *code)
{
    if (set->size && set->slots[slot_of(set->slots, set->size, code)] == code) {
        return;
    }
    if (2 * (set->used + 1) > set->size && grow(set) < 0) {
        out_of_memory = 1;
        return;
    }
    Py_INCREF(code);
    set->slots[slot_of(set->slots, set->size, code)] = code;
    set->used++;
}

/* The codes of a set as a list; the set is left empty. */
static PyObject *
drain(CodeSet *set)
{
    PyObject *list = PyList_New(set->used);
    if (list == NULL) {
        return NULL;
    }
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < set->size; i++) {
        if (set->slots[i] != NULL) {
            PyList_SET_ITEM(list, n++, set->slots[i]); /* the set's reference moves */
            set->slots[i] = NULL;
        }
    }
    set->used = 0;
    return list;
}

static int
is_module(PyCodeObject *code)
{
    PyObject *name = code->co_name;
    return PyUnicode_GET_LENGTH(name) == 8 && PyUnicode_CompareWithASCIIString(name, "<module>") == 0;
}

static int
on_event(PyObject *self, PyFrameObject *frame, int what, PyObject *arg)
{
    if (what != PyTrace_CALL && !(what == PyTrace_RETURN && importing)) {
        return 0;
    }
    PyCodeObject *code = PyFrame_GetCode(frame);
    if (what == PyTrace_CALL) {
        if (is_module(code)) {
            importing++;
        }
        note(&seen, (PyObject *)code);
        if (importing) {
            note(&imported, (PyObject *)code);
        }
    }
    else if (is_module(code)) { /* a return, also when the import raised */
        importing--;
    }
    Py_DECREF(code);
    return 0;
}

static PyObject *
enable(PyObject *module, PyObject *unused)
{
    PyEval_SetProfile(on_event, hook);
    Py_RETURN_NONE;
}

static PyObject *
disable(PyObject *module, PyObject *unused)
{
    PyEval_SetProfile(NULL, NULL);
    Py_RETURN_NONE;
}

static PyObject *
take(PyObject *module, PyObject *unused)
{
    if (out_of_memory) {
        out_of_memory = 0;
        Py_XDECREF(drain(&seen));
        Py_XDECREF(drain(&imported));
        return PyErr_NoMemory();
    }
    PyObject *codes = drain(&seen);
    PyObject *by_imports = codes ? drain(&imported) : NULL;
    if (by_imports == NULL) {
        Py_XDECREF(codes);
        return NULL;
    }
    return Py_BuildValue("(NN)", codes, by_imports);
}

static PyMethodDef methods[] = {
    {"enable", enable, METH_NOARGS, "Set the hook as this thread's profile function."},
    {"disable", disable, METH_NOARGS, "Clear this thread's profile function."},
    {"take", take, METH_NOARGS,
     "The code objects run since the last take, and those run by an import; empties both."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef calls_module = {
    PyModuleDef_HEAD_INIT, "devpool.select._calls", "Which code objects ran.", -1, methods,
};

PyMODINIT_FUNC
PyInit__calls(void)
{
    PyObject *module = PyModule_Create(&calls_module);
    if (module == NULL) {
        return NULL;
    }
    hook = PyUnicode_FromString("devpool.select._calls");
    if (hook == NULL || PyModule_AddObjectRef(module, "HOOK", hook) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
