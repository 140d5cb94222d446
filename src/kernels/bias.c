// Bias add over rows: y (N, D) += b (D), and its backward db += column sums of dy;
// and the plain vector add dst += src (moe_add_inplace).
//
// Used after the expert GEMMs (and by moe_linear_backward for db); the vector add
// wherever a reduced gradient is added into the gradient. The inner loops run
// along a row, contiguous and restrict-qualified, so they vectorize.
//
// Not here: fusing the bias into the GEMM (BLAS has no epilogue) or into the
// activation.
#include <stddef.h>

#include "moe/kernels.h"

void moe_add_inplace(float *dst, const float *src, size_t n) {
  float *restrict d = dst;
  const float *restrict s = src;
  for (size_t i = 0; i < n; i++) d[i] += s[i];
}

// y is (n, d), b is (d).
void moe_bias_add_forward(float *y, const float *b, int n, int d) {
  const float *restrict br = b;
  for (int i = 0; i < n; i++) {
    float *restrict row = y + (size_t)i * (size_t)d;
    for (int j = 0; j < d; j++) row[j] += br[j];
  }
}

// Column sums go through a block of BIAS_ROWS rows at a time into a small
// stack accumulator: summing N = 8192 rows straight into db would let the
// rounding error grow with N; two levels keep each sum ~BIAS_ROWS + N/BIAS_ROWS
// additions deep, at the same speed (the accumulator stays in L1).
#define BIAS_COLS 256
#define BIAS_ROWS 64

// db is (d), dy is (n, d).
void moe_bias_add_backward(float *db, const float *dy, int n, int d) {
  float acc[BIAS_COLS];
  for (int j0 = 0; j0 < d; j0 += BIAS_COLS) {
    const int jn = d - j0 < BIAS_COLS ? d - j0 : BIAS_COLS;
    float *restrict dbr = db + j0;
    for (int i0 = 0; i0 < n; i0 += BIAS_ROWS) {
      const int i1 = n - i0 < BIAS_ROWS ? n : i0 + BIAS_ROWS;
      float *restrict a = acc;
      for (int j = 0; j < jn; j++) a[j] = 0.0f;
      for (int i = i0; i < i1; i++) {
        const float *restrict row = dy + (size_t)i * (size_t)d + (size_t)j0;
        for (int j = 0; j < jn; j++) a[j] += row[j];
      }
      for (int j = 0; j < jn; j++) dbr[j] += a[j];
    }
  }
}

void moe_bias_add_forward_ref(float *y, const float *b, int n, int d) {
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < d; j++) y[(size_t)i * (size_t)d + (size_t)j] += b[j];
  }
}
