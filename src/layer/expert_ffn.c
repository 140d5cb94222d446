// Expert kind "ffn": the FFN expert with CBLAS GEMMs (the default).
//   forward   pre = x w1 + b1; h = act(pre); y = h w2 + b2
//   backward  db2 += sum dY; dw2 += h^T dY; dh = dY w2^T; dpre = act'(pre) dh;
//             db1 += sum dpre; dw1 += x^T dpre; dX = dpre w1^T
// Two GEMMs of 2nMH FLOPs forward, four backward.
#include <string.h>

#include "layer/layer_internal.h"
#include "moe/expert.h"
#include "moe/kernels.h"
#include "moe/layer_ops.h"

static void ffn_forward(const moe_layer_config *cfg, const moe_expert_params *p, const float *xe,
                        int n, float *pre, float *h, float *ye, moe_layer_timing *tm) {
  const int M = cfg->model_dim, H = cfg->hidden_dim;
  if (n == 0) return;
  moe_timed_gemm(&tm->expert_gemm_ms, 0, 0, n, H, M, xe, M, p->w1, H, 0.0f, pre, H);
  uint64_t t0 = moe_time_ns();
  moe_bias_add_forward(pre, p->b1, n, H);
  if (cfg->act == MOE_ACT_GELU) {
    moe_gelu_forward(h, pre, (size_t)n * H);
  } else {
    moe_relu_forward(h, pre, (size_t)n * H);
  }
  tm->expert_other_ms += moe_time_ms_since(t0);
  moe_timed_gemm(&tm->expert_gemm_ms, 0, 0, n, M, H, h, H, p->w2, M, 0.0f, ye, M);
  t0 = moe_time_ns();
  moe_bias_add_forward(ye, p->b2, n, M);
  tm->expert_other_ms += moe_time_ms_since(t0);
  tm->expert_flops += 4.0 * n * (double)M * (double)H;
}

static void ffn_backward(const moe_layer_config *cfg, const moe_expert_params *p,
                         const moe_expert_grads *g, const float *xe, const float *pre,
                         const float *h, float *dyx, int n, float *dh, float *dpre,
                         moe_layer_timing *tm) {
  const int M = cfg->model_dim, H = cfg->hidden_dim;
  if (n == 0) return;
  uint64_t t0 = moe_time_ns();
  moe_bias_add_backward(g->db2, dyx, n, M);
  memset(dpre, 0, (size_t)n * (size_t)H * sizeof(float));
  tm->expert_other_ms += moe_time_ms_since(t0);
  // dw2 += h^T dY; dh = dY w2^T
  moe_timed_gemm(&tm->expert_gemm_ms, 1, 0, H, M, n, h, H, dyx, M, 1.0f, g->dw2, M);
  moe_timed_gemm(&tm->expert_gemm_ms, 0, 1, n, H, M, dyx, M, p->w2, M, 0.0f, dh, H);
  t0 = moe_time_ns();
  if (cfg->act == MOE_ACT_GELU) {
    moe_gelu_backward(dpre, dh, pre, (size_t)n * H);
  } else {
    moe_relu_backward(dpre, dh, pre, (size_t)n * H);
  }
  moe_bias_add_backward(g->db1, dpre, n, H);
  tm->expert_other_ms += moe_time_ms_since(t0);
  // dw1 += xe^T dpre; dX = dpre w1^T, written over dY (no longer needed)
  moe_timed_gemm(&tm->expert_gemm_ms, 1, 0, M, H, n, xe, M, dpre, H, 1.0f, g->dw1, H);
  moe_timed_gemm(&tm->expert_gemm_ms, 0, 1, n, M, H, dpre, H, p->w1, H, 0.0f, dyx, M);
  tm->expert_flops += 8.0 * n * (double)M * (double)H;
}

const moe_expert_kind moe_expert_ffn = {"ffn", "FFN expert on CBLAS GEMMs", ffn_forward,
                                        ffn_backward};
