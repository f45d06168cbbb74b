/* Which code objects ran: a frame-evaluation hook (PEP 523) for Python 3.11, used by
 * select/watch.py (NativeHook). 3.12 has sys.monitoring instead.
 *
 * A profile hook (cProfile's, or any other) makes 3.11 trace every instruction, which
 * turns off its specialised instructions: a call-heavy test then costs about twice as much.
 * A frame-evaluation hook is called once as each frame starts or resumes, in every
 * thread, and the interpreter runs the frame as usual. The hook puts the code object in
 * a pointer set, and in a second set while a module's top-level code runs (an import:
 * what it runs counts for every later test). The sets hold strong references, so a
 * pointer is never reused while it is in a set. Everything here runs with the GIL. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define Py_BUILD_CORE_MODULE
#include "internal/pycore_frame.h" /* _PyInterpreterFrame.f_code */
#undef Py_BUILD_CORE_MODULE

typedef struct {
    PyObject **slots; /* NULL or a code object with a reference held */
    Py_ssize_t size;  /* a power of two, or 0 before the first insert */
    Py_ssize_t used;
} CodeSet;

static CodeSet seen, imported;
static long importing;    /* module bodies running, in every thread together */
static int out_of_memory; /* a code object could not be noted since the last take */

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

static PyObject *
evaluate(PyThreadState *thread, _PyInterpreterFrame *frame, int throwing)
{
    PyObject *code = (PyObject *)frame->f_code;
    if (!is_module(frame->f_code)) {
        note(&seen, code);
        if (importing) {
            note(&imported, code);
        }
        return _PyEval_EvalFrameDefault(thread, frame, throwing);
    }
    importing++;
    note(&seen, code);
    note(&imported, code);
    PyObject *result = _PyEval_EvalFrameDefault(thread, frame, throwing);
    importing--;
    return result;
}

static PyObject *
enable(PyObject *module, PyObject *unused)
{
    PyInterpreterState *interpreter = PyInterpreterState_Get();
    _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(interpreter);
    if (current != _PyEval_EvalFrameDefault && current != evaluate) {
        Py_RETURN_FALSE; /* a debugger's or a JIT's: it stays */
    }
    _PyInterpreterState_SetEvalFrameFunc(interpreter, evaluate);
    Py_RETURN_TRUE;
}

static PyObject *
disable(PyObject *module, PyObject *unused)
{
    PyInterpreterState *interpreter = PyInterpreterState_Get();
    if (_PyInterpreterState_GetEvalFrameFunc(interpreter) != evaluate) {
        Py_RETURN_FALSE; /* something replaced it (torch.compile does, and puts back none) */
    }
    _PyInterpreterState_SetEvalFrameFunc(interpreter, _PyEval_EvalFrameDefault);
    Py_RETURN_TRUE;
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
    {"enable", enable, METH_NOARGS, "Set the hook; False when another one is set."},
    {"disable", disable, METH_NOARGS, "Clear the hook; False when it was not set."},
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
    return PyModule_Create(&calls_module);
}
