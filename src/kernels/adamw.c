// AdamW optimizer step (Loshchilov & Hutter), matching torch.optim.AdamW with
// amsgrad=False, maximize=False: decoupled weight decay p *= 1 - lr*wd first,
// then the bias-corrected Adam update. The state m, v lives with the caller.
//
// The step-dependent scalars (bias corrections, step size) are computed once
// per call in double, like PyTorch does in Python, so that only the
// per-element arithmetic is float. The loop is memory-bound (p, m, v, g: 28
// bytes moved per parameter); no attempt is made to vectorize sqrt/division,
// which the compiler will not do without -fno-math-errno.
//
// Not here: AMSGrad, gradient clipping, mixed-precision master weights.
#include <math.h>
#include <stddef.h>

#include "moe/kernels.h"

// p, m, v, g are (n).
void moe_adamw_update(float *p, float *m, float *v, const float *g, size_t n,
                      const moe_adamw_config *cfg, int t) {
  const double b1 = cfg->beta1, b2 = cfg->beta2;
  const float decay = (float)(1.0 - (double)cfg->lr * (double)cfg->weight_decay);
  const float step = (float)((double)cfg->lr / (1.0 - pow(b1, t)));
  const float bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
  const float beta1 = cfg->beta1, beta2 = cfg->beta2, eps = cfg->eps;
  const float one_b1 = (float)(1.0 - b1), one_b2 = (float)(1.0 - b2);
  float *restrict pr = p;
  float *restrict mr = m;
  float *restrict vr = v;
  const float *restrict gr = g;
  for (size_t i = 0; i < n; i++) {
    const float gi = gr[i];
    const float mi = beta1 * mr[i] + one_b1 * gi;
    const float vi = beta2 * vr[i] + one_b2 * (gi * gi);
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    pr[i] = pr[i] * decay - step * (mi / denom);
    mr[i] = mi;
    vr[i] = vi;
  }
}

// The header's formula in double, element by element, with every scalar
// recomputed from cfg.
void moe_adamw_update_ref(float *p, float *m, float *v, const float *g, size_t n,
                          const moe_adamw_config *cfg, int t) {
  const double lr = cfg->lr, b1 = cfg->beta1, b2 = cfg->beta2, eps = cfg->eps,
               wd = cfg->weight_decay;
  for (size_t i = 0; i < n; i++) {
    double pi = p[i];
    pi -= lr * wd * pi;
    const double gi = g[i];
    const double mi = b1 * m[i] + (1.0 - b1) * gi;
    const double vi = b2 * v[i] + (1.0 - b2) * gi * gi;
    const double mhat = mi / (1.0 - pow(b1, t));
    const double vhat = vi / (1.0 - pow(b2, t));
    pi -= lr * mhat / (sqrt(vhat) + eps);
    p[i] = (float)pi;
    m[i] = (float)mi;
    v[i] = (float)vi;
  }
}
