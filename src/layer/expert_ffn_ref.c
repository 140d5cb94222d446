// Expert kind "ffn-ref": the FFN expert as naive loops with double
// accumulation and the activation evaluated in double. Slow (no blocking, no
// BLAS); it exists as the reference a new expert kind is tested against
// (tests/test_expert.c compares every kind with it) and as the smallest worked
// example of a kind (docs/extending.md).
#include <math.h>
#include <string.h>

#include "layer/layer_internal.h"
#include "moe/expert.h"

static double act(moe_activation a, double x) {
  return a == MOE_ACT_GELU ? 0.5 * x * (1.0 + erf(x / sqrt(2.0))) : (x > 0.0 ? x : 0.0);
}

static double act_grad(moe_activation a, double x) {
  if (a == MOE_ACT_RELU) return x > 0.0 ? 1.0 : 0.0;
  const double pi = 3.14159265358979323846;
  return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * pi);
}

static void ref_forward(const moe_layer_config *cfg, const moe_expert_params *p, const float *x,
                        int n, float *pre, float *h, float *y, moe_layer_timing *tm) {
  const int M = cfg->model_dim, H = cfg->hidden_dim;
  const uint64_t t0 = moe_time_ns();
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < H; j++) {
      double s = p->b1[j];
      for (int k = 0; k < M; k++) s += (double)x[(size_t)i * M + k] * p->w1[(size_t)k * H + j];
      pre[(size_t)i * H + j] = (float)s;
      h[(size_t)i * H + j] = (float)act(cfg->act, (float)s);
    }
    for (int j = 0; j < M; j++) {
      double s = p->b2[j];
      for (int k = 0; k < H; k++) s += (double)h[(size_t)i * H + k] * p->w2[(size_t)k * M + j];
      y[(size_t)i * M + j] = (float)s;
    }
  }
  // the loops are the two matrix products: their time and FLOPs count as GEMMs
  tm->expert_gemm_ms += moe_time_ms_since(t0);
  tm->expert_flops += 4.0 * n * (double)M * (double)H;
}

static void ref_backward(const moe_layer_config *cfg, const moe_expert_params *p,
                         const moe_expert_grads *g, const float *x, const float *pre,
                         const float *h, float *dyx, int n, float *dh, float *dpre,
                         moe_layer_timing *tm) {
  const int M = cfg->model_dim, H = cfg->hidden_dim;
  const uint64_t t0 = moe_time_ns();
  (void)dh;
  for (int j = 0; j < M; j++) {  // db2 += sum_i dY
    double s = 0.0;
    for (int i = 0; i < n; i++) s += dyx[(size_t)i * M + j];
    g->db2[j] += (float)s;
  }
  for (int k = 0; k < H; k++) {  // dw2 += h^T dY
    for (int j = 0; j < M; j++) {
      double s = 0.0;
      for (int i = 0; i < n; i++) s += (double)h[(size_t)i * H + k] * dyx[(size_t)i * M + j];
      g->dw2[(size_t)k * M + j] += (float)s;
    }
  }
  for (int i = 0; i < n; i++) {  // dpre = act'(pre) * (dY w2^T)
    for (int k = 0; k < H; k++) {
      double s = 0.0;
      for (int j = 0; j < M; j++) s += (double)dyx[(size_t)i * M + j] * p->w2[(size_t)k * M + j];
      dpre[(size_t)i * H + k] = (float)(act_grad(cfg->act, pre[(size_t)i * H + k]) * s);
    }
  }
  for (int k = 0; k < H; k++) {  // db1 += sum_i dpre
    double s = 0.0;
    for (int i = 0; i < n; i++) s += dpre[(size_t)i * H + k];
    g->db1[k] += (float)s;
  }
  for (int m = 0; m < M; m++) {  // dw1 += x^T dpre
    for (int k = 0; k < H; k++) {
      double s = 0.0;
      for (int i = 0; i < n; i++) s += (double)x[(size_t)i * M + m] * dpre[(size_t)i * H + k];
      g->dw1[(size_t)m * H + k] += (float)s;
    }
  }
  for (int i = 0; i < n; i++) {  // dX = dpre w1^T, over dY
    for (int m = 0; m < M; m++) {
      double s = 0.0;
      for (int k = 0; k < H; k++) s += (double)dpre[(size_t)i * H + k] * p->w1[(size_t)m * H + k];
      dyx[(size_t)i * M + m] = (float)s;
    }
  }
  tm->expert_gemm_ms += moe_time_ms_since(t0);
  tm->expert_flops += 8.0 * n * (double)M * (double)H;
}

const moe_expert_kind moe_expert_ffn_ref = {
    "ffn-ref", "FFN expert as naive loops (double accumulation): the reference", ref_forward,
    ref_backward};
