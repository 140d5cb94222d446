// Layer normalisation over the last dimension, y = (x - mean) * rstd * gamma +
// beta, with mean and rstd saved for the backward pass (the pre-norm of a
// transformer block around the MoE layer).
//
// Variance is computed in two passes (mean first, then squared deviations),
// which stays accurate when |mean| >> std, unlike E[x^2] - E[x]^2. Row sums use
// FM_LANES independent partial sums (fastmath.h) so they vectorize and have a
// fixed order.
//
// Not here: RMSNorm, normalisation over other axes, or running statistics.
#include <math.h>
#include <stddef.h>

#include "kernels/fastmath.h"
#include "moe/kernels.h"

// y, x are (n, d); mean, rstd are (n); gamma, beta are (d).
void moe_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                           const float *beta, int n, int d, float eps) {
  const float *restrict g = gamma;
  const float *restrict b = beta;
  for (int i = 0; i < n; i++) {
    const float *restrict xr = x + (size_t)i * (size_t)d;
    float *restrict yr = y + (size_t)i * (size_t)d;
    const float mu = fm_row_sum(xr, d) / (float)d;
    const float rs = 1.0f / sqrtf(fm_row_sq_dev(xr, d, mu) / (float)d + eps);
    for (int j = 0; j < d; j++) yr[j] = (xr[j] - mu) * rs * g[j] + b[j];
    mean[i] = mu;
    rstd[i] = rs;
  }
}

// dx, dy, x are (n, d); mean, rstd are (n); dgamma, dbeta, gamma are (d).
// With xhat = (x - mean) rstd and g = dy gamma:
//   dx += rstd (g - mean_j(g) - xhat mean_j(g xhat)), dgamma += sum_rows dy xhat,
//   dbeta += sum_rows dy.
// dgamma/dbeta accumulate row by row in float, straight into the caller's
// buffers (no scratch).
void moe_layernorm_backward(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                            const float *mean, const float *rstd, const float *gamma, int n,
                            int d) {
  float *restrict dg = dgamma;
  float *restrict db = dbeta;
  const float *restrict ga = gamma;
  for (int i = 0; i < n; i++) {
    const float *restrict xr = x + (size_t)i * (size_t)d;
    const float *restrict dyr = dy + (size_t)i * (size_t)d;
    float *restrict dxr = dx + (size_t)i * (size_t)d;
    const float mu = mean[i], rs = rstd[i];
    // Both row sums in one pass; xhat is recomputed, not stored (no scratch).
    float lane1[FM_LANES] = {0}, lane2[FM_LANES] = {0};
    int j = 0;
    for (; j + FM_LANES <= d; j += FM_LANES) {
      for (int l = 0; l < FM_LANES; l++) {
        const float gj = dyr[j + l] * ga[j + l];
        lane1[l] += gj;
        lane2[l] += gj * ((xr[j + l] - mu) * rs);
      }
    }
    float s1 = 0.0f, s2 = 0.0f;
    for (; j < d; j++) {
      const float gj = dyr[j] * ga[j];
      s1 += gj;
      s2 += gj * ((xr[j] - mu) * rs);
    }
    for (int l = 0; l < FM_LANES; l++) {
      s1 += lane1[l];
      s2 += lane2[l];
    }
    const float c1 = s1 / (float)d, c2 = s2 / (float)d;
    for (int jj = 0; jj < d; jj++) {
      const float xhat = (xr[jj] - mu) * rs;
      dxr[jj] += rs * (dyr[jj] * ga[jj] - c1 - xhat * c2);
      dg[jj] += dyr[jj] * xhat;
      db[jj] += dyr[jj];
    }
  }
}

// Two-pass statistics and the output in double.
void moe_layernorm_forward_ref(float *y, float *mean, float *rstd, const float *x,
                               const float *gamma, const float *beta, int n, int d, float eps) {
  for (int i = 0; i < n; i++) {
    const float *xr = x + (size_t)i * (size_t)d;
    double mu = 0.0, var = 0.0;
    for (int j = 0; j < d; j++) mu += xr[j];
    mu /= d;
    for (int j = 0; j < d; j++) var += ((double)xr[j] - mu) * ((double)xr[j] - mu);
    var /= d;
    const double rs = 1.0 / sqrt(var + (double)eps);
    for (int j = 0; j < d; j++) {
      y[(size_t)i * (size_t)d + (size_t)j] =
          (float)(((double)xr[j] - mu) * rs * gamma[j] + beta[j]);
    }
    mean[i] = (float)mu;
    rstd[i] = (float)rs;
  }
}
