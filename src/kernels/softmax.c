// Row softmax (forward, backward) and row log-sum-exp, for the MoE gate
// (logits (T, E) -> probs) and for cross-entropy over a vocabulary.
//
// Both subtract the row maximum first, so rows with entries ~1e4 stay finite.
// The exponential is fm_exp_split from fastmath.h (Cody-Waite reduction +
// polynomial, no libm call) so the elementwise loops vectorize; the row
// reductions (max, sum, dot) run over FM_LANES independent partial results,
// which the compiler keeps in vector registers (a plain float sum cannot be
// vectorized without -ffast-math, because reordering changes the rounding), and
// which fixes the summation order so results do not depend on the instruction
// set.
//
// Not here: masking, temperature, or online (single-pass) softmax.
#include <math.h>
#include <stdint.h>

#include "kernels/fastmath.h"
#include "moe/kernels.h"

// exp(z) for z <= 0 (z = x - rowmax). Below EXP_CUT exp(z) is under FLT_MIN and
// is flushed to 0 (so -inf -> 0); NaN gives NaN. ~1 ulp on the rest.
#define EXP_CUT -87.3f

static inline float exp_nonpos(float z) {
  // No clamp to EXP_CUT before the arithmetic (a `?:` with a constant arm is
  // turned into a branch and blocks vectorization): below the cut the values
  // computed are meaningless but never trap, and `keep` discards them.
  const uint32_t keep = 0u - (uint32_t) !(z < EXP_CUT);
  return fm_bits_and(fm_exp_split(z, -0.0f), keep);
}

// Largest non-NaN entry of x (d); -inf if there is none.
static float row_max(const float *restrict x, int d) {
  float lane[FM_LANES];
  for (int l = 0; l < FM_LANES; l++) lane[l] = -INFINITY;
  int j = 0;
  for (; j + FM_LANES <= d; j += FM_LANES) {
    for (int l = 0; l < FM_LANES; l++) lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
  }
  float m = -INFINITY;
  for (; j < d; j++) m = x[j] > m ? x[j] : m;
  for (int l = 0; l < FM_LANES; l++) m = lane[l] > m ? lane[l] : m;
  return m;
}

// sum_j exp(x_j - m), without storing the exponentials.
static float row_exp_sum(const float *restrict x, int d, float m) {
  float lane[FM_LANES] = {0};
  int j = 0;
  for (; j + FM_LANES <= d; j += FM_LANES) {
    for (int l = 0; l < FM_LANES; l++) lane[l] += exp_nonpos(x[j + l] - m);
  }
  float s = 0.0f;
  for (; j < d; j++) s += exp_nonpos(x[j] - m);
  for (int l = 0; l < FM_LANES; l++) s += lane[l];
  return s;
}

// y = exp(x - m); separate in-place version because y == x is allowed and the
// two pointers cannot both be restrict then.
static void exp_shift(float *restrict y, const float *restrict x, int d, float m) {
  for (int j = 0; j < d; j++) y[j] = exp_nonpos(x[j] - m);
}

static void exp_shift_inplace(float *restrict y, int d, float m) {
  for (int j = 0; j < d; j++) y[j] = exp_nonpos(y[j] - m);
}

static void scale_row(float *restrict y, int d, float s) {
  for (int j = 0; j < d; j++) y[j] *= s;
}

// ---- softmax ----------------------------------------------------------------------

// y, x are (n, d); y == x allowed.
void moe_softmax_forward(float *y, const float *x, int n, int d) {
  for (int i = 0; i < n; i++) {
    const size_t off = (size_t)i * (size_t)d;
    const float m = row_max(x + off, d);
    if (y == x) {
      exp_shift_inplace(y + off, d, m);
    } else {
      exp_shift(y + off, x + off, d, m);
    }
    // sum >= 1 (the max contributes exp(0)) unless the row holds NaN or +-inf.
    scale_row(y + off, d, 1.0f / fm_row_sum(y + off, d));
  }
}

// dx, dy, y are (n, d); y is the forward output.
void moe_softmax_backward(float *dx, const float *dy, const float *y, int n, int d) {
  for (int i = 0; i < n; i++) {
    const size_t off = (size_t)i * (size_t)d;
    const float *restrict yr = y + off;
    const float *restrict dyr = dy + off;
    float *restrict dxr = dx + off;
    const float dot = fm_row_dot(dyr, yr, d);
    for (int j = 0; j < d; j++) dxr[j] += yr[j] * (dyr[j] - dot);
  }
}

void moe_softmax_forward_ref(float *y, const float *x, int n, int d) {
  for (int i = 0; i < n; i++) {
    const float *xr = x + (size_t)i * (size_t)d;
    float *yr = y + (size_t)i * (size_t)d;
    double m = -INFINITY, s = 0.0;
    for (int j = 0; j < d; j++) m = xr[j] > m ? xr[j] : m;
    for (int j = 0; j < d; j++) s += exp((double)xr[j] - m);
    for (int j = 0; j < d; j++) yr[j] = (float)(exp((double)xr[j] - m) / s);
  }
}

// ---- log-sum-exp ------------------------------------------------------------------------

// lse is (n), x is (n, d).
void moe_logsumexp_forward(float *lse, const float *x, int n, int d) {
  for (int i = 0; i < n; i++) {
    const float *xr = x + (size_t)i * (size_t)d;
    const float m = row_max(xr, d);
    if (m == INFINITY || m == -INFINITY) {
      // Every number is +-inf (or there is none): the shifted sum would be
      // inf - inf. The answer is m itself, unless a NaN is present.
      float r = m;
      for (int j = 0; j < d; j++) r = xr[j] != xr[j] ? xr[j] : r;
      lse[i] = r;
    } else {
      lse[i] = m + logf(row_exp_sum(xr, d, m));
    }
  }
}
