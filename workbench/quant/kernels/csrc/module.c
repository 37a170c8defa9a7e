/* Python bindings of the CPU kernels (module workbench.quant._cpu_kernels). Pointers arrive as
 * integers from torch.Tensor.data_ptr() / numpy's ctypes.data; the Python side checks dtypes,
 * contiguity and sizes before calling. Every call releases the GIL while it computes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "kernels.h"

static PyObject *py_quantize(PyObject *self, PyObject *args) {
    unsigned long long x_ptr, y_ptr, params_ptr;
    long long outer, channels, inner;
    int dtype, mode, dequant, nthreads;
    float lo, hi;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKiLLLKffiii", &x_ptr, &y_ptr, &dtype, &outer, &channels, &inner, &params_ptr, &lo,
                          &hi, &mode, &dequant, &nthreads))
        return NULL;
    if (dtype != WB_DT_F32 && dtype != WB_DT_F16 && dtype != WB_DT_BF16) {
        PyErr_Format(PyExc_ValueError, "unsupported dtype code %d", dtype);
        return NULL;
    }
    if (mode != WB_MODE_MUL_DIV && mode != WB_MODE_DIV_MUL) {
        PyErr_Format(PyExc_ValueError, "unsupported mode %d", mode);
        return NULL;
    }
    if (outer < 0 || channels < 1 || inner < 1) {
        PyErr_SetString(PyExc_ValueError, "shape must have outer >= 0, channels >= 1, inner >= 1");
        return NULL;
    }
    int negative = 0;
    Py_BEGIN_ALLOW_THREADS
    negative = wb_fake_quant((const void *)(uintptr_t)x_ptr, (void *)(uintptr_t)y_ptr, dtype, outer, channels, inner,
                             (const wb_qparam_t *)(uintptr_t)params_ptr, lo, hi, mode, dequant, nthreads);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(negative);
}

static PyObject *py_ste_grad(PyObject *self, PyObject *args) {
    unsigned long long x_ptr, g_ptr, y_ptr, thresholds_ptr;
    long long outer, channels, inner;
    int dtype, nthreads;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKiLLLKi", &x_ptr, &g_ptr, &y_ptr, &dtype, &outer, &channels, &inner,
                          &thresholds_ptr, &nthreads))
        return NULL;
    if (dtype != WB_DT_F32 && dtype != WB_DT_F16 && dtype != WB_DT_BF16) {
        PyErr_Format(PyExc_ValueError, "unsupported dtype code %d", dtype);
        return NULL;
    }
    if (outer < 0 || channels < 1 || inner < 1) {
        PyErr_SetString(PyExc_ValueError, "shape must have outer >= 0, channels >= 1, inner >= 1");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    wb_ste_grad((const void *)(uintptr_t)x_ptr, (const void *)(uintptr_t)g_ptr, (void *)(uintptr_t)y_ptr, dtype, outer,
                channels, inner, (const float *)(uintptr_t)thresholds_ptr, nthreads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_quant_params(PyObject *self, PyObject *args) {
    unsigned long long amax_ptr, out_ptr;
    long long n;
    float max_bound;
    int mode;
    (void)self;
    if (!PyArg_ParseTuple(args, "KLfiK", &amax_ptr, &n, &max_bound, &mode, &out_ptr)) return NULL;
    if (mode != WB_MODE_MUL_DIV && mode != WB_MODE_DIV_MUL) {
        PyErr_Format(PyExc_ValueError, "unsupported mode %d", mode);
        return NULL;
    }
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        return NULL;
    }
    float smallest = wb_quant_params((const float *)(uintptr_t)amax_ptr, n, max_bound, mode,
                                     (wb_qparam_t *)(uintptr_t)out_ptr);
    return PyFloat_FromDouble((double)smallest);
}

static PyObject *py_entropy_divergences(PyObject *self, PyObject *args) {
    unsigned long long bins_ptr, out_ptr;
    long long n, groups, start, stride;
    int nthreads;
    (void)self;
    if (!PyArg_ParseTuple(args, "KLLLLKi", &bins_ptr, &n, &groups, &start, &stride, &out_ptr, &nthreads)) return NULL;
    if (n < 1 || groups < 1 || start < 1 || stride < 1) {
        PyErr_SetString(PyExc_ValueError, "entropy search needs n, groups, start, stride >= 1");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    wb_entropy_divergences((const double *)(uintptr_t)bins_ptr, n, groups, start, stride, (double *)(uintptr_t)out_ptr,
                           nthreads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_mse_errors(PyObject *self, PyObject *args) {
    unsigned long long counts_ptr, centers_ptr, out_ptr;
    long long n, start, stride;
    double max_bound;
    int uniform, nthreads;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKLdLLpKi", &counts_ptr, &centers_ptr, &n, &max_bound, &start, &stride, &uniform,
                          &out_ptr, &nthreads))
        return NULL;
    if (n < 1 || start < 0 || stride < 1 || max_bound < 1) {
        PyErr_SetString(PyExc_ValueError, "mse search needs n >= 1, start >= 0, stride >= 1, max_bound >= 1");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    wb_mse_errors((const double *)(uintptr_t)counts_ptr, (const double *)(uintptr_t)centers_ptr, n, max_bound, start,
                  stride, uniform, (double *)(uintptr_t)out_ptr, nthreads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_histogram(PyObject *self, PyObject *args) {
    unsigned long long x_ptr, counts_ptr;
    long long n, row_length, row_step, bins;
    int dtype, width_exponent, min_exponent, skip_zeros, nthreads;
    (void)self;
    if (!PyArg_ParseTuple(args, "KiLLLiiLpKi", &x_ptr, &dtype, &n, &row_length, &row_step, &width_exponent,
                          &min_exponent, &bins, &skip_zeros, &counts_ptr, &nthreads))
        return NULL;
    if (dtype != WB_DT_F32 && dtype != WB_DT_F16 && dtype != WB_DT_BF16) {
        PyErr_Format(PyExc_ValueError, "unsupported dtype code %d", dtype);
        return NULL;
    }
    if (n < 0 || bins < 1 || bins >= (1LL << 24) || row_length < 1 || (n > 0 && n % row_length != 0) ||
        row_step < row_length) {
        PyErr_SetString(PyExc_ValueError, "histogram needs n >= 0, 1 <= bins < 2**24, rows of row_length >= 1 values "
                                          "dividing n, and row_step >= row_length");
        return NULL;
    }
    int64_t nonfinite = 0;
    float max_abs = 0.0f;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = wb_histogram((const void *)(uintptr_t)x_ptr, dtype, n, row_length, row_step, &width_exponent, min_exponent,
                          bins, skip_zeros, (int64_t *)(uintptr_t)counts_ptr, &nonfinite, &max_abs, nthreads);
    Py_END_ALLOW_THREADS
    if (status < 0) return PyErr_NoMemory();
    /* (width exponent after the batch, NaN/Inf count, largest finite |x|) */
    return Py_BuildValue("(iLd)", width_exponent, (long long)nonfinite, (double)max_abs);
}

static PyObject *py_abs_max(PyObject *self, PyObject *args) {
    unsigned long long x_ptr;
    long long n, row_length, row_step;
    int dtype, nthreads;
    (void)self;
    if (!PyArg_ParseTuple(args, "KiLLLi", &x_ptr, &dtype, &n, &row_length, &row_step, &nthreads)) return NULL;
    if (dtype != WB_DT_F32 && dtype != WB_DT_F16 && dtype != WB_DT_BF16) {
        PyErr_Format(PyExc_ValueError, "unsupported dtype code %d", dtype);
        return NULL;
    }
    if (n < 0 || row_length < 1 || (n > 0 && n % row_length != 0) || row_step < row_length) {
        PyErr_SetString(PyExc_ValueError, "abs_max needs n >= 0, rows of row_length >= 1 values dividing n, and "
                                          "row_step >= row_length");
        return NULL;
    }
    float max_abs = 0.0f;
    int64_t nonfinite = 0;
    Py_BEGIN_ALLOW_THREADS
    wb_abs_max((const void *)(uintptr_t)x_ptr, dtype, n, row_length, row_step, &max_abs, &nonfinite, nthreads);
    Py_END_ALLOW_THREADS
    /* (largest finite |x|, NaN/Inf count) */
    return Py_BuildValue("(dL)", (double)max_abs, (long long)nonfinite);
}

static PyObject *py_abs_max_rows(PyObject *self, PyObject *args) {
    unsigned long long x_ptr, out_ptr;
    long long rows, row_length;
    int dtype, nthreads;
    (void)self;
    if (!PyArg_ParseTuple(args, "KiLLKi", &x_ptr, &dtype, &rows, &row_length, &out_ptr, &nthreads)) return NULL;
    if (dtype != WB_DT_F32 && dtype != WB_DT_F16 && dtype != WB_DT_BF16) {
        PyErr_Format(PyExc_ValueError, "unsupported dtype code %d", dtype);
        return NULL;
    }
    if (rows < 0 || row_length < 1) {
        PyErr_SetString(PyExc_ValueError, "abs_max_rows needs rows >= 0 and row_length >= 1");
        return NULL;
    }
    int64_t nonfinite = 0;
    Py_BEGIN_ALLOW_THREADS
    wb_abs_max_rows((const void *)(uintptr_t)x_ptr, dtype, rows, row_length, (float *)(uintptr_t)out_ptr, &nonfinite,
                    nthreads);
    Py_END_ALLOW_THREADS
    return PyLong_FromLongLong((long long)nonfinite); /* the maxima are in the float32 buffer at out_ptr */
}

static PyObject *py_isa(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(wb_isa());
}

/* Tests call this to exercise the portable loops on machines that have AVX2. */
static PyObject *py_force_portable(PyObject *self, PyObject *arg) {
    (void)self;
    int flag = PyObject_IsTrue(arg);
    if (flag < 0) return NULL;
    wb_force_portable(flag);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"quantize", py_quantize, METH_VARARGS, "Fused (fake) quantization of a contiguous CPU buffer."},
    {"ste_grad", py_ste_grad, METH_VARARGS, "Straight-through-estimator gradient of a contiguous CPU buffer."},
    {"quant_params", py_quant_params, METH_VARARGS, "Scale pairs of float32 amax values; returns the smallest."},
    {"entropy_divergences", py_entropy_divergences, METH_VARARGS, "KL divergence of every entropy candidate."},
    {"mse_errors", py_mse_errors, METH_VARARGS, "Squared error of every mse candidate."},
    {"histogram", py_histogram, METH_VARARGS,
     "Add |x| to a histogram with power-of-two bins, widened as needed; returns (width exponent, NaN/Inf, max |x|)."},
    {"abs_max", py_abs_max, METH_VARARGS, "Largest finite |x| and the NaN/Inf count of a CPU buffer, in one pass."},
    {"abs_max_rows", py_abs_max_rows, METH_VARARGS,
     "Largest finite |x| of every row of a contiguous CPU matrix into a float32 buffer; returns the NaN/Inf count."},
    {"isa", py_isa, METH_NOARGS, "Instruction set the kernels use on this CPU."},
    {"force_portable", py_force_portable, METH_O, "Use the portable loops even where AVX2 is available."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpu_kernels", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cpu_kernels(void) { return PyModule_Create(&module); }
