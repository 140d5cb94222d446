// GEMM and the dense linear layer y = x W + b: thin wrappers over CBLAS sgemm
// (row-major), plus naive reference versions the tests compare against.
//
// This is where nearly all MoE-layer FLOPs go, so on the BLAS path moe_gemm
// adds nothing on top of BLAS except the degenerate shapes BLAS would reject or mishandle: with
// m, n or k == 0 the row-major leading-dimension checks of some CBLAS builds
// fail (ld >= max(1, cols)), so those cases never reach BLAS.
//
// The `openblas` compute backend (backend.c has the catalogue and moe_gemm's
// dispatch; gemm_fixed.c the default `fixed` one).
//
// Not here: threading (BLAS threads are set once by the caller with
// moe_blas_set_threads), batched/grouped GEMM.
#include <cblas.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>

#include "kernels/kernels_internal.h"
#include "moe/kernels.h"
#include "moe_build_config.h"

// ---- BLAS control ------------------------------------------------------------------

void moe_blas_set_threads(int n) {
#if MOE_HAVE_OPENBLAS_THREADS
  openblas_set_num_threads(n < 1 ? 1 : n);
#else
  (void)n;
#endif
}

// OpenBLAS reports its version and build ("OpenBLAS 0.3.21 DYNAMIC_ARCH ...
// Haswell MAX_THREADS=64"); the string is static inside the library.
const char *moe_blas_name(void) {
#if MOE_HAVE_OPENBLAS_CONFIG
  const char *cfg = openblas_get_config();
  return cfg ? cfg : "OpenBLAS";
#else
  return "CBLAS";
#endif
}

// ---- GEMM ----------------------------------------------------------------------------

// C = beta * C over an (m, n) block with row stride ldc. beta == 0 writes exact
// zeros (BLAS semantics: C is not read, so NaN/Inf in C do not survive).
void moe_gemm_scale_c(float *c, int m, int n, int ldc, float beta) {
  for (int i = 0; i < m; i++) {
    float *restrict row = c + (size_t)i * (size_t)ldc;
    if (beta == 0.0f) {
      for (int j = 0; j < n; j++) row[j] = 0.0f;
    } else if (beta != 1.0f) {
      for (int j = 0; j < n; j++) row[j] *= beta;
    }
  }
}

// ---- per-thread scratch of the fixed-order kernels ------------------------------------

static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
static int g_scratch_key_ok;

static void scratch_key_make(void) {
  g_scratch_key_ok = pthread_key_create(&g_scratch_key, free) == 0;
}

void *moe_gemm_scratch(void) {
  pthread_once(&g_scratch_once, scratch_key_make);
  if (!g_scratch_key_ok) return NULL;
  void *buf = pthread_getspecific(g_scratch_key);
  if (!buf) {
    buf = aligned_alloc(64, MOE_GEMM_SCRATCH_BYTES);
    if (buf && pthread_setspecific(g_scratch_key, buf) != 0) {
      free(buf);
      buf = NULL;
    }
  }
  return buf;
}

// c is (m, n) with row stride ldc; a is (m, k) or, transposed, (k, m) with row
// stride lda; b is (k, n) or, transposed, (n, k) with row stride ldb.
static void gemm_openblas(int trans_a, int trans_b, int m, int n, int k, float alpha,
                          const float *a, int lda, const float *b, int ldb, float beta, float *c,
                          int ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    moe_gemm_scale_c(c, m, n, ldc, beta);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static const char *openblas_unavailable(void) { return NULL; }

const moe_backend moe_backend_openblas = {
    .name = "openblas",
    .summary = "OpenBLAS sgemm (fast; bits depend on the shape, so not across rank counts)",
    .batch_invariant = 0,
    .unavailable = openblas_unavailable,
    .gemm = gemm_openblas,
    .set_threads = moe_blas_set_threads,
    .describe = moe_blas_name,
};

// Triple loop accumulating in double: the reference has a much smaller rounding
// error than sgemm, so test tolerances measure sgemm alone.
void moe_gemm_ref(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                  int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  for (int i = 0; i < m; i++) {
    for (int j = 0; j < n; j++) {
      double acc = 0.0;
      for (int p = 0; p < k; p++) {
        const float av = trans_a ? a[(size_t)p * (size_t)lda + (size_t)i]
                                 : a[(size_t)i * (size_t)lda + (size_t)p];
        const float bv = trans_b ? b[(size_t)j * (size_t)ldb + (size_t)p]
                                 : b[(size_t)p * (size_t)ldb + (size_t)j];
        acc += (double)av * (double)bv;
      }
      float *cij = c + (size_t)i * (size_t)ldc + (size_t)j;
      const double old = beta == 0.0f ? 0.0 : (double)beta * (double)*cij;
      *cij = (float)((double)alpha * acc + old);
    }
  }
}

// ---- linear: y = x W + b ---------------------------------------------------------------

// Fills each row of y (n, dout) with b (dout), or zeros when b is NULL, so the
// GEMM can accumulate with beta = 1.
static void fill_rows(float *y, const float *b, int n, int dout) {
  for (int i = 0; i < n; i++) {
    float *restrict row = y + (size_t)i * (size_t)dout;
    if (b) {
      const float *restrict br = b;
      for (int j = 0; j < dout; j++) row[j] = br[j];
    } else {
      for (int j = 0; j < dout; j++) row[j] = 0.0f;
    }
  }
}

// y is (n, dout), x is (n, din), w is (din, dout), b is (dout) or NULL.
void moe_linear_forward(float *y, const float *x, const float *w, const float *b, int n, int din,
                        int dout) {
  if (b) {
    fill_rows(y, b, n, dout);
    moe_gemm(0, 0, n, dout, din, 1.0f, x, din, w, dout, 1.0f, y, dout);
  } else {
    moe_gemm(0, 0, n, dout, din, 1.0f, x, din, w, dout, 0.0f, y, dout);
  }
}

// dx (n, din) += dy w^T; dw (din, dout) += x^T dy; db (dout) += column sums of
// dy (n, dout). dx and db may be NULL.
void moe_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                         const float *w, int n, int din, int dout) {
  if (dx) moe_gemm(0, 1, n, din, dout, 1.0f, dy, dout, w, dout, 1.0f, dx, din);
  moe_gemm(1, 0, din, dout, n, 1.0f, x, din, dy, dout, 1.0f, dw, dout);
  if (db) moe_bias_add_backward(db, dy, n, dout);
}

void moe_linear_forward_ref(float *y, const float *x, const float *w, const float *b, int n,
                            int din, int dout) {
  fill_rows(y, b, n, dout);
  moe_gemm_ref(0, 0, n, dout, din, 1.0f, x, din, w, dout, 1.0f, y, dout);
}
