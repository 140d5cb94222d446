// Ordinary least squares for t = alpha + beta * x: the alpha-beta model of a
// collective (x = bytes), the GEMM model (x = FLOPs) and the compressor model
// (x = bytes), fitted from benchmark points. Centred sums, so large x (bytes,
// FLOPs ~1e12) do not lose precision.
#include <math.h>

#include "moe/perf.h"

// The coefficients, RMS residual and R² of a fit over n points with residual
// sum ss_res, centred sum of squares syy and mean my of y.
static void fit_store(moe_linear_fit *out, double alpha, double beta, double gamma, int n,
                      double ss_res, double syy, double my) {
  out->alpha = alpha;
  out->beta = beta;
  out->gamma = gamma;
  out->n = n;
  out->rmse = sqrt(ss_res / n);
  // exact fits (including constant y) have R² = 1; rounding can leave a
  // residual of a few ulps of y, which must not turn into R² = 0
  const double tiny = 1e-24 * (my * my + 1e-300) * n;
  out->r2 = syy > tiny ? 1.0 - ss_res / syy : (ss_res <= tiny ? 1.0 : 0.0);
}

moe_status moe_fit_linear(moe_ctx *ctx, const double *x, const double *y, int n,
                          moe_linear_fit *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !x || !y || !out, MOE_STATUS_INVALID_ARG, "fit: x, y and out must not be NULL");
  MOE_FAIL_IF(ctx, n < 2, MOE_STATUS_INVALID_ARG, "fit: needs at least 2 points, got %d", n);
  double mx = 0.0, my = 0.0;
  for (int i = 0; i < n; i++) {
    MOE_FAIL_IF(ctx, !isfinite(x[i]) || !isfinite(y[i]), MOE_STATUS_INVALID_ARG,
                "fit: point %d (%g, %g) is not finite", i, x[i], y[i]);
    mx += x[i];
    my += y[i];
  }
  mx /= n;
  my /= n;
  double sxx = 0.0, sxy = 0.0, syy = 0.0;
  for (int i = 0; i < n; i++) {
    const double dx = x[i] - mx, dy = y[i] - my;
    sxx += dx * dx;
    sxy += dx * dy;
    syy += dy * dy;
  }
  MOE_FAIL_IF(ctx, !(sxx > 0.0), MOE_STATUS_INVALID_ARG,
              "fit: all %d points have the same x (%g): the slope is undetermined; measure at "
              "least two sizes",
              n, mx);
  const double beta = sxy / sxx, alpha = my - beta * mx;
  double ss_res = 0.0;
  for (int i = 0; i < n; i++) {
    const double r = y[i] - (alpha + beta * x[i]);
    ss_res += r * r;
  }
  fit_store(out, alpha, beta, 0.0, n, ss_res, syy, my);
done:
  return st;
}

moe_status moe_fit_linear_nonneg(moe_ctx *ctx, const double *x, const double *y, int n,
                                 moe_linear_fit *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(moe_fit_linear(ctx, x, y, n, out));  // checks the points
  if (out->alpha >= 0 && out->beta >= 0) return st;
  // the optimum lies on the boundary: the better of alpha = 0 (through the
  // origin, beta >= 0) and beta = 0 (the mean, alpha >= 0)
  double sxx = 0, sxy = 0, my = 0, syy = 0;
  for (int i = 0; i < n; i++) {
    sxx += x[i] * x[i];
    sxy += x[i] * y[i];
    my += y[i];
  }
  my /= n;
  for (int i = 0; i < n; i++) syy += (y[i] - my) * (y[i] - my);
  const double b0 = sxx > 0 && sxy > 0 ? sxy / sxx : 0.0, a1 = my > 0 ? my : 0.0;
  double r0 = 0, r1 = 0;
  for (int i = 0; i < n; i++) {
    r0 += (y[i] - b0 * x[i]) * (y[i] - b0 * x[i]);
    r1 += (y[i] - a1) * (y[i] - a1);
  }
  if (r0 <= r1)
    fit_store(out, 0.0, b0, 0.0, n, r0, syy, my);
  else
    fit_store(out, a1, 0.0, 0.0, n, r1, syy, my);
done:
  return st;
}

double moe_fit_eval(const moe_linear_fit *fit, double x) { return fit->alpha + fit->beta * x; }

moe_status moe_fit_linear2(moe_ctx *ctx, const double *x, const double *w, const double *y, int n,
                           moe_linear_fit *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !x || !w || !y || !out, MOE_STATUS_INVALID_ARG,
              "fit: x, w, y and out must not be NULL");
  MOE_FAIL_IF(ctx, n < 3, MOE_STATUS_INVALID_ARG, "fit: needs at least 3 points, got %d", n);
  double mx = 0, mw = 0, my = 0;
  for (int i = 0; i < n; i++) {
    MOE_FAIL_IF(ctx, !isfinite(x[i]) || !isfinite(w[i]) || !isfinite(y[i]), MOE_STATUS_INVALID_ARG,
                "fit: point %d (%g, %g, %g) is not finite", i, x[i], w[i], y[i]);
    mx += x[i];
    mw += w[i];
    my += y[i];
  }
  mx /= n;
  mw /= n;
  my /= n;
  double sxx = 0, sww = 0, sxw = 0, sxy = 0, swy = 0, syy = 0;
  for (int i = 0; i < n; i++) {
    const double dx = x[i] - mx, dw = w[i] - mw, dy = y[i] - my;
    sxx += dx * dx;
    sww += dw * dw;
    sxw += dx * dw;
    sxy += dx * dy;
    swy += dw * dy;
    syy += dy * dy;
  }
  const double det = sxx * sww - sxw * sxw;
  MOE_FAIL_IF(ctx, !(det > 1e-12 * sxx * sww), MOE_STATUS_INVALID_ARG,
              "fit: the two regressors are collinear over the %d points; vary them independently",
              n);
  const double beta = (sxy * sww - swy * sxw) / det, gamma = (swy * sxx - sxy * sxw) / det;
  const double alpha = my - beta * mx - gamma * mw;
  double ss_res = 0;
  for (int i = 0; i < n; i++) {
    const double r = y[i] - (alpha + beta * x[i] + gamma * w[i]);
    ss_res += r * r;
  }
  fit_store(out, alpha, beta, gamma, n, ss_res, syy, my);
done:
  return st;
}

double moe_fit_eval2(const moe_linear_fit *fit, double x, double w) {
  return fit->alpha + fit->beta * x + fit->gamma * w;
}
