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

// Column sums: one addition per row and column, in row order, straight into
// db (vectorized over the columns, which changes no bit). So splitting the
// rows over consecutive calls gives the same bits as one call, as the fixed
// GEMM's k-continuation does (kernels.h): an expert's bias gradient computed
// piece by piece on several ranks in row order (the deterministic mode under
// Parm's MP split of the rows) equals the single-process one.
// db is (d), dy is (n, d).
void moe_bias_add_backward(float *db, const float *dy, int n, int d) {
  float *restrict dbr = db;
  for (int i = 0; i < n; i++) {
    const float *restrict row = dy + (size_t)i * (size_t)d;
    for (int j = 0; j < d; j++) dbr[j] += row[j];
  }
}

void moe_bias_add_forward_ref(float *y, const float *b, int n, int d) {
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < d; j++) y[(size_t)i * (size_t)d + (size_t)j] += b[j];
  }
}
