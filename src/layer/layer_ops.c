// Building blocks of the MoE layer (see layer_ops.h): the math of
// docs/moe-layer.md, step by step, on caller-provided buffers. The single-
// process layer and the expert-parallel layer both run exactly this code, so
// they cannot drift apart.
#include "moe/layer_ops.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe/kernels.h"

void moe_timed_gemm(double *ms, int ta, int tb, int m, int n, int k, const float *a, int lda,
                    const float *b, int ldb, float beta, float *c, int ldc) {
  const uint64_t t0 = moe_time_ns();
  moe_gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  *ms += moe_time_ms_since(t0);
}

size_t moe_layer_max_rows(const moe_layer_config *cfg) {
  const size_t tk = (size_t)cfg->tokens * (size_t)cfg->top_k;
  const int c = moe_layer_capacity(cfg, cfg->tokens);
  if (c < 0) return tk;
  const size_t ec = (size_t)cfg->num_experts * (size_t)c;
  return ec < tk ? ec : tk;
}

void moe_init_uniform_slice(float *x, size_t n, uint64_t seed, uint64_t stream, size_t first,
                            float bound) {
  moe_rng rng;
  moe_rng_init(&rng, seed, stream);
  rng.index = first;
  moe_rng_fill_uniform(&rng, x, n, -bound, bound);
}

moe_status moe_forward_checks(moe_ctx *ctx, const moe_layer_config *cfg, const float *x, int tokens,
                              const float *y) {
  moe_status st = MOE_STATUS_OK;
  const int M = cfg->model_dim;
  MOE_FAIL_IF(ctx, tokens < 0 || tokens > cfg->tokens, MOE_STATUS_INVALID_ARG,
              "tokens (%d) must be in [0, %d] (the layer's configured tokens)", tokens,
              cfg->tokens);
  MOE_FAIL_IF(ctx, tokens > 0 && (!x || !y), MOE_STATUS_INVALID_ARG, "x and y must not be NULL");
  const size_t bytes = (size_t)tokens * (size_t)M * sizeof(float);
  const uintptr_t xb = (uintptr_t)x, yb = (uintptr_t)y;
  MOE_FAIL_IF(ctx, tokens > 0 && xb < yb + bytes && yb < xb + bytes, MOE_STATUS_INVALID_ARG,
              "x and y must not overlap (backward needs the input x unchanged)");
  if (cfg->check_finite) MOE_TRY(moe_check_finite(ctx, "input x", x, tokens, M));
done:
  return st;
}

moe_status moe_check_finite(moe_ctx *ctx, const char *name, const float *x, int tokens, int cols) {
  moe_status st = MOE_STATUS_OK;
  const ptrdiff_t bad = moe_find_nonfinite(x, (size_t)tokens * (size_t)cols);
  MOE_FAIL_IF(ctx, bad >= 0, MOE_STATUS_INVALID_ARG,
              "%s has a non-finite value (%g) at token %td, column %td", name, (double)x[bad],
              bad / cols, bad % cols);
done:
  return st;
}

// ---- gate ------------------------------------------------------------------------------

const float *moe_router_bias_active(const float *bias, int E) {
  if (!bias) return NULL;
  for (int e = 0; e < E; e++)
    if (bias[e] != 0.0f) return bias;
  return NULL;
}

moe_status moe_gate_route(moe_ctx *ctx, const moe_layer_config *cfg, const float *wg,
                          const float *x, int T, moe_gate_buffers *gb, moe_route *r,
                          moe_layer_timing *tm) {
  moe_status st = MOE_STATUS_OK;
  const int M = cfg->model_dim, E = cfg->num_experts, K = cfg->top_k;
  // batch-invariant: a token's logits (and so its routing) are bitwise the same
  // whatever the tokens beside it, the rank count, the layout or the chunks
  const uint64_t t0 = moe_time_ns();
  moe_gemm_fixed(0, 0, T, E, M, 1.0f, x, M, wg, E, 0.0f, gb->logits, E);
  tm->gate_gemm_ms += moe_time_ms_since(t0);
  tm->gate_flops += 2.0 * T * M * E;
  moe_softmax_forward(gb->probs, gb->logits, T, E);
  moe_logsumexp_forward(gb->lse, gb->logits, T, E);
  if (T > 0 && gb->bias) {
    // choose by logits + bias, weigh by the unbiased probabilities
    for (int t = 0; t < T; t++) {
      const float *l = gb->logits + (size_t)t * E;
      float *s = gb->scores + (size_t)t * E;
      for (int e = 0; e < E; e++) s[e] = l[e] + gb->bias[e];
    }
    moe_topk_forward(r->expert, gb->topk_p, gb->scores, T, E, K);
    for (int t = 0; t < T; t++)
      for (int k = 0; k < K; k++)
        gb->topk_p[(size_t)t * K + k] = gb->probs[(size_t)t * E + r->expert[(size_t)t * K + k]];
  } else if (T > 0) {
    moe_topk_forward(r->expert, gb->topk_p, gb->probs, T, E, K);
  }
  gb->topo_rerouted = 0;
  if (T > 0 && gb->topo_local)
    gb->topo_rerouted =
        moe_topo_gate_reselect(r->expert, gb->topk_p, gb->bias ? gb->scores : gb->probs, gb->probs,
                               T, E, K, gb->topo_local, gb->topo_share, gb->topo_scratch);
  for (int t = 0; t < T; t++) {
    const float *p = gb->topk_p + (size_t)t * K;
    float *w = r->weight + (size_t)t * K;
    float sum = 0.0f;
    for (int k = 0; k < K; k++) sum += p[k];
    for (int k = 0; k < K; k++) w[k] = cfg->renormalize ? p[k] / sum : p[k];
  }
  MOE_TRY(moe_route_assign(ctx, r, T, moe_layer_capacity(cfg, T)));
  if (cfg->renormalize && cfg->gate_convention == MOE_GATE_DEEPSPEED) {
    // DeepSpeed: the kept choices' probabilities over their sum, after
    // dropping; a dropped choice weighs 0 (all dropped: every weight 0)
    for (int t = 0; t < T; t++) {
      const float *p = gb->topk_p + (size_t)t * K;
      const int32_t *slot = r->slot + (size_t)t * K;
      float *w = r->weight + (size_t)t * K;
      float sum = 0.0f;
      for (int k = 0; k < K; k++)
        if (slot[k] >= 0) sum += p[k];
      for (int k = 0; k < K; k++) w[k] = slot[k] >= 0 ? p[k] / sum : 0.0f;
    }
  }
done:
  return st;
}

// ---- topology-aware gate -------------------------------------------------------------------

typedef struct {
  float score;
  int32_t choice;  // t * K + k
} topo_cand;

// Highest score first; equal scores: the earlier choice first (a total order).
static int topo_by_score(const void *a, const void *b) {
  const topo_cand *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  return (x->choice > y->choice) - (x->choice < y->choice);
}

static int topo_by_choice(const void *a, const void *b) {
  const topo_cand *x = a, *y = b;
  return (x->choice > y->choice) - (x->choice < y->choice);
}

int moe_topo_gate_reselect(int32_t *expert, float *topk_p, const float *scores, const float *probs,
                           int T, int E, int K, const uint8_t *local, double share, void *scratch) {
  topo_cand *c = scratch;
  int n = 0;
  for (int i = 0; i < T * K; i++) {
    const int e = expert[i];
    const float v = scores[(size_t)(i / K) * E + e];
    if (!local[e]) c[n++] = (topo_cand){isnan(v) ? -INFINITY : v, i};  // NaN ranks last
  }
  const double cap = share > 0 ? floor(share * (double)T * (double)K) : 0.0;  // NaN: 0
  const int budget = !(cap > 0) ? 0 : cap >= (double)n ? n : (int)cap;
  if (n <= budget) return 0;
  // the budget's best go; the rest re-select, in choice order
  qsort(c, (size_t)n, sizeof *c, topo_by_score);
  qsort(c + budget, (size_t)(n - budget), sizeof *c, topo_by_choice);
  int rerouted = 0;
  for (int j = budget; j < n; j++) {
    const int i = c[j].choice, t = i / K;
    const float *s = scores + (size_t)t * E;
    const int32_t *mine = expert + (size_t)t * K;
    int best = -1;
    for (int e = 0; e < E; e++) {
      // NaN scores rank below every number (and below -inf: never chosen over one)
      if (!local[e] || (best >= 0 && !(s[e] > s[best]) && !isnan(s[best]))) continue;
      if (best >= 0 && isnan(s[e])) continue;
      int taken = 0;
      for (int k = 0; k < K; k++) taken |= mine[k] == e;
      if (!taken) best = e;
    }
    if (best < 0) continue;  // no local expert left for this token: it keeps its choice
    expert[i] = best;
    topk_p[i] = probs[(size_t)t * E + best];
    rerouted++;
  }
  return rerouted;
}

// Choices that count in the load-balancing loss per token: all K (libmoe,
// Megatron-Core) or the first (GShard, DeepSpeed).
static int aux_choices(const moe_layer_config *cfg) {
  return cfg->gate_convention == MOE_GATE_DEEPSPEED ? 1 : cfg->top_k;
}

void moe_gate_loss_stats(const moe_layer_config *cfg, const moe_gate_buffers *gb,
                         const moe_route *r, int T, double *stats) {
  const int E = cfg->num_experts;
  for (int e = 0; e < E; e++) {
    double pe = 0.0;
    for (int t = 0; t < T; t++) pe += gb->probs[(size_t)t * E + e];
    stats[e] = r->count_all[e];
    stats[E + e] = pe;
  }
  if (aux_choices(cfg) == 1) {  // first choices only, before dropping
    for (int e = 0; e < E; e++) stats[e] = 0.0;
    for (int t = 0; t < T; t++) stats[r->expert[(size_t)t * cfg->top_k]] += 1.0;
  }
  double z = 0.0;
  for (int t = 0; t < T; t++) z += (double)gb->lse[t] * gb->lse[t];
  stats[2 * E] = z;
  stats[2 * E + 1] = T;
}

void moe_gate_losses(const moe_layer_config *cfg, const double *stats, float *aux, float *z) {
  const int E = cfg->num_experts, K = aux_choices(cfg);
  const double T = stats[2 * E + 1];
  double a = 0.0;
  if (T > 0) {
    // aux = E * sum_e f_e * P_e; z = mean_t lse_t^2 (docs/moe-layer.md step 7)
    for (int e = 0; e < E; e++) a += (stats[e] / (T * K)) * (stats[E + e] / T);
    a *= E;
  }
  *aux = (float)a;
  *z = T > 0 ? (float)(stats[2 * E] / T) : 0.0f;
}

void moe_gate_backward(const moe_layer_config *cfg, const moe_gate_buffers *gb, const moe_route *r,
                       int T, const double *stats, const float *dweight, float *dprobs,
                       float *dlogits, const float *x, const float *wg, float *dwg, float *dx,
                       moe_layer_timing *tm) {
  const int M = cfg->model_dim, E = cfg->num_experts, K = cfg->top_k;
  const double Tg = stats[2 * E + 1];  // tokens of the global batch
  memset(dprobs, 0, (size_t)T * E * sizeof(float));
  // top-k (and renormalisation) backward: dweight -> dprobs
  for (int t = 0; t < T; t++) {
    const float *dw = dweight + (size_t)t * K, *w = r->weight + (size_t)t * K;
    const float *p = gb->topk_p + (size_t)t * K;
    float *dp = dprobs + (size_t)t * E;
    if (cfg->renormalize) {
      // w_k = p_k / sum over the renormalised set (every choice, or with the
      // DeepSpeed convention the kept ones; a dropped one is constant 0)
      const int after_drop = cfg->gate_convention == MOE_GATE_DEEPSPEED;
      const int32_t *slot = r->slot + (size_t)t * K;
      float sum = 0.0f, dot = 0.0f;
      for (int k = 0; k < K; k++) {
        if (after_drop && slot[k] < 0) continue;
        sum += p[k];
        dot += dw[k] * w[k];
      }
      for (int k = 0; k < K; k++) {
        if (after_drop && slot[k] < 0) continue;
        dp[r->expert[t * K + k]] += (dw[k] - dot) / sum;
      }
    } else {
      for (int k = 0; k < K; k++) dp[r->expert[t * K + k]] += dw[k];
    }
  }
  // aux: d/dprobs[t,e] of coef * E * sum_e f_e * mean_t probs[t,e] over the global batch
  if (cfg->aux_loss_coef > 0.0f && T > 0) {
    const int Ka = aux_choices(cfg);
    for (int e = 0; e < E; e++) {
      const float g = (float)((double)cfg->aux_loss_coef * E * (stats[e] / (Tg * Ka)) / Tg);
      for (int t = 0; t < T; t++) dprobs[(size_t)t * E + e] += g;
    }
  }
  memset(dlogits, 0, (size_t)T * E * sizeof(float));
  moe_softmax_backward(dlogits, dprobs, gb->probs, T, E);
  // z-loss: d/dlogits[t,e] of coef * mean_t lse_t^2 = coef * 2/Tg * lse_t * probs[t,e]
  if (cfg->z_loss_coef > 0.0f && T > 0) {
    for (int t = 0; t < T; t++) {
      const float g = cfg->z_loss_coef * 2.0f / (float)Tg * gb->lse[t];
      for (int e = 0; e < E; e++) dlogits[(size_t)t * E + e] += g * gb->probs[(size_t)t * E + e];
    }
  }
  // dwg += x^T dlogits (a sum over this call's tokens); dx += dlogits wg^T,
  // batch-invariant like the forward
  // (fp32 whatever moe_gemm's precision: the router stays fp32)
  if (dwg) {
    const uint64_t tg = moe_time_ns();
    moe_gemm_fp32(1, 0, M, E, T, 1.0f, x, M, dlogits, E, 1.0f, dwg, E);
    tm->gate_gemm_ms += moe_time_ms_since(tg);
  }
  const uint64_t t0 = moe_time_ns();
  moe_gemm_fixed(0, 1, T, M, E, 1.0f, dlogits, E, wg, E, 1.0f, dx, M);
  tm->gate_gemm_ms += moe_time_ms_since(t0);
  tm->gate_flops += 4.0 * T * M * E;
}

// ---- dispatch and combine ------------------------------------------------------------------

void moe_dispatch_forward(const moe_route *r, const float *x, int M, float *xe) {
  for (int row = 0; row < r->rows; row++) {
    memcpy(xe + (size_t)row * M, x + (size_t)r->row_token[row] * M, (size_t)M * sizeof(float));
  }
}

void moe_dispatch_backward(const moe_route *r, const float *dxe, int M, float *dx) {
  for (int row = 0; row < r->rows; row++) {
    float *dxt = dx + (size_t)r->row_token[row] * M;
    const float *src = dxe + (size_t)row * M;
    for (int j = 0; j < M; j++) dxt[j] += src[j];
  }
}

void moe_combine_forward(const moe_route *r, const float *ye, int M, int T, float *y) {
  const int K = r->top_k;
  if (T > 0) memset(y, 0, (size_t)T * (size_t)M * sizeof(float));
  // choices in order k = 0..K-1; dropped choices add nothing
  for (int t = 0; t < T; t++) {
    float *yt = y + (size_t)t * M;
    for (int k = 0; k < K; k++) {
      const int s = r->slot[t * K + k];
      if (s < 0) continue;
      const float w = r->weight[t * K + k];
      const float *src = ye + (size_t)(r->offset[r->expert[t * K + k]] + s) * M;
      for (int j = 0; j < M; j++) yt[j] += w * src[j];
    }
  }
}

void moe_combine_backward(const moe_route *r, const float *dy, const float *ye, int M, int T,
                          float *dye, float *dweight) {
  const int K = r->top_k;
  memset(dweight, 0, (size_t)T * K * sizeof(float));
  for (int row = 0; row < r->rows; row++) {
    const int t = r->row_token[row], k = r->row_choice[row];
    const float w = r->weight[t * K + k];
    const float *dyt = dy + (size_t)t * M, *src = ye + (size_t)row * M;
    float *d = dye + (size_t)row * M;
    double dot = 0.0;
    for (int j = 0; j < M; j++) {
      d[j] = w * dyt[j];
      dot += (double)dyt[j] * src[j];
    }
    dweight[t * K + k] = (float)dot;
  }
}
