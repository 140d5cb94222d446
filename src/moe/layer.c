// The single-process MoE layer: gate -> top-k -> routing plan -> dispatch ->
// expert FFNs -> combine, and the backward of each step (docs/moe-layer.md).
//
// All buffers are carved from two arenas at create time (parameters+gradients,
// activations+scratch) for the configured maximum of T tokens, so forward and
// backward allocate nothing. Each expert runs as two GEMMs over all of its rows
// (forward) and four (backward); every GEMM is timed so benchmarks can compare
// the layer with its GEMMs alone.
//
// Deliberately not here: communication, chunking and scheduling (comm/, sched/
// build on the routing plan and placement this file exposes).
#include "moe/layer.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "moe/kernels.h"

struct moe_layer {
  moe_ctx *ctx;
  moe_layer_config cfg;
  int max_rows;  // R: rows the expert buffers hold
  moe_arena param_arena;
  moe_arena work_arena;
  moe_layer_tensors t;
  moe_route route;
  moe_placement placement;
  // forward activations
  float *logits;  // (T, E)
  float *probs;   // (T, E)
  float *lse;     // (T): logsumexp of logits, for the z-loss
  float *topk_p;  // (T, K): probabilities of the chosen experts
  float *xe;      // (R, M): dispatched rows, expert-ordered
  float *pre;     // (R, H): pre-activation
  float *h;       // (R, H): activation
  float *ye;      // (R, M): expert outputs
  // backward scratch
  float *dye;      // (R, M): grads of expert outputs, then reused for grads of xe
  float *dh;       // (R, H)
  float *dpre;     // (R, H)
  float *dweight;  // (T, K)
  float *dprobs;   // (T, E)
  float *dlogits;  // (T, E)
  // state of the last forward
  const float *x_last;
  int tokens_last;
  int have_forward;
  moe_layer_stats stats;
  moe_layer_timing fwd_timing, bwd_timing;
};

static size_t max_rows_for(const moe_layer_config *cfg) {
  const size_t tk = (size_t)cfg->tokens * (size_t)cfg->top_k;
  const int c = moe_layer_capacity(cfg, cfg->tokens);
  if (c < 0) return tk;
  const size_t ec = (size_t)cfg->num_experts * (size_t)c;
  return ec < tk ? ec : tk;
}

// Warns once per process when the BLAS runs kernels weaker than the CPU allows.
static void warn_slow_blas_once(void) {
  static atomic_int warned = 0;
  const char *better = moe_blas_better_core();
  if (better && atomic_exchange(&warned, 1) == 0) {
    MOE_WARN(
        "OpenBLAS runs its '%s' kernels on a CPU that supports '%s'; set "
        "OPENBLAS_CORETYPE=%s before starting for several times faster GEMMs",
        moe_blas_core(), better, better);
  }
}

moe_status moe_layer_create(moe_ctx *ctx, const moe_layer_config *cfg, moe_layer **out) {
  moe_status st = MOE_STATUS_OK;
  moe_layer *L = NULL;
  warn_slow_blas_once();
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "out must not be NULL");
  *out = NULL;
  MOE_TRY(moe_layer_config_validate(ctx, cfg));
  L = moe_calloc(1, sizeof *L);
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate the layer");
  L->ctx = ctx;
  L->cfg = *cfg;
  const size_t T = (size_t)cfg->tokens, M = (size_t)cfg->model_dim, H = (size_t)cfg->hidden_dim,
               E = (size_t)cfg->num_experts, K = (size_t)cfg->top_k;
  const size_t R = max_rows_for(cfg);
  MOE_FAIL_IF(ctx, R > (size_t)MOE_MAX_ROWS, MOE_STATUS_INVALID_ARG,
              "tokens x top_k (%zu rows) exceeds %d", R, MOE_MAX_ROWS);
  L->max_rows = (int)R;

  moe_layer_tensors *t = &L->t;
  const moe_tensor_spec params[] = {
      {"wg", M * E, &t->wg},       {"w1", E * M * H, &t->w1}, {"b1", E * H, &t->b1},
      {"w2", E * H * M, &t->w2},   {"b2", E * M, &t->b2},     {"dwg", M * E, &t->dwg},
      {"dw1", E * M * H, &t->dw1}, {"db1", E * H, &t->db1},   {"dw2", E * H * M, &t->dw2},
      {"db2", E * M, &t->db2},
  };
  const moe_tensor_spec work[] = {
      {"logits", T * E, &L->logits}, {"probs", T * E, &L->probs},
      {"lse", T, &L->lse},           {"topk_p", T * K, &L->topk_p},
      {"xe", R * M, &L->xe},         {"pre", R * H, &L->pre},
      {"h", R * H, &L->h},           {"ye", R * M, &L->ye},
      {"dye", R * M, &L->dye},       {"dh", R * H, &L->dh},
      {"dpre", R * H, &L->dpre},     {"dweight", T * K, &L->dweight},
      {"dprobs", T * E, &L->dprobs}, {"dlogits", T * E, &L->dlogits},
  };
  const int np = (int)(sizeof params / sizeof params[0]);
  const int nw = (int)(sizeof work / sizeof work[0]);
  const size_t pbytes = moe_tensor_table_bytes(params, np);
  const size_t wbytes = moe_tensor_table_bytes(work, nw);
  MOE_FAIL_IF(ctx, pbytes == SIZE_MAX || wbytes == SIZE_MAX, MOE_STATUS_INVALID_ARG,
              "layer sizes overflow the address space (M %zu, H %zu, E %zu, T %zu)", M, H, E, T);
  MOE_TRY(moe_arena_init(ctx, &L->param_arena, pbytes));
  MOE_TRY(moe_arena_init(ctx, &L->work_arena, wbytes));
  MOE_TRY(moe_tensor_table_carve(ctx, &L->param_arena, params, np));
  MOE_TRY(moe_tensor_table_carve(ctx, &L->work_arena, work, nw));
  MOE_TRY(moe_route_init(ctx, &L->route, cfg->tokens, cfg->top_k, cfg->num_experts, L->max_rows));
  MOE_TRY(moe_placement_init(ctx, &L->placement, cfg->num_experts, 1));
  *out = L;
  L = NULL;
done:
  moe_layer_destroy(L);
  return st;
}

void moe_layer_destroy(moe_layer *L) {
  if (!L) return;
  moe_arena_free(&L->param_arena);
  moe_arena_free(&L->work_arena);
  moe_route_free(&L->route);
  moe_placement_free(&L->placement);
  moe_free(L);
}

const moe_layer_config *moe_layer_get_config(const moe_layer *L) { return &L->cfg; }
moe_layer_tensors moe_layer_get_tensors(moe_layer *L) { return L->t; }
const moe_route *moe_layer_get_route(const moe_layer *L) { return &L->route; }
const moe_placement *moe_layer_get_placement(const moe_layer *L) { return &L->placement; }
moe_layer_timing moe_layer_get_forward_timing(const moe_layer *L) { return L->fwd_timing; }
moe_layer_timing moe_layer_get_backward_timing(const moe_layer *L) { return L->bwd_timing; }

size_t moe_layer_num_params(const moe_layer *L) {
  const size_t M = (size_t)L->cfg.model_dim, H = (size_t)L->cfg.hidden_dim,
               E = (size_t)L->cfg.num_experts;
  return M * E + E * (M * H + H + H * M + M);
}

void moe_layer_init_params(moe_layer *L, uint64_t seed) {
  const size_t M = (size_t)L->cfg.model_dim, H = (size_t)L->cfg.hidden_dim,
               E = (size_t)L->cfg.num_experts;
  const float am = 1.0f / sqrtf((float)M), ah = 1.0f / sqrtf((float)H);
  struct {
    float *p;
    size_t n;
    float a;
  } const init[] = {{L->t.wg, M * E, am},
                    {L->t.w1, E * M * H, am},
                    {L->t.b1, E * H, am},
                    {L->t.w2, E * H * M, ah},
                    {L->t.b2, E * M, ah}};
  for (size_t i = 0; i < sizeof init / sizeof init[0]; i++) {
    moe_rng rng;
    moe_rng_init(&rng, seed, i + 1);
    moe_rng_fill_uniform(&rng, init[i].p, init[i].n, -init[i].a, init[i].a);
  }
}

void moe_layer_zero_grad(moe_layer *L) {
  const size_t M = (size_t)L->cfg.model_dim, H = (size_t)L->cfg.hidden_dim,
               E = (size_t)L->cfg.num_experts;
  memset(L->t.dwg, 0, M * E * sizeof(float));
  memset(L->t.dw1, 0, E * M * H * sizeof(float));
  memset(L->t.db1, 0, E * H * sizeof(float));
  memset(L->t.dw2, 0, E * H * M * sizeof(float));
  memset(L->t.db2, 0, E * M * sizeof(float));
}

// ---- forward -----------------------------------------------------------------------

// Timed GEMM: adds its wall time to *ms.
static void timed_gemm(double *ms, int ta, int tb, int m, int n, int k, const float *a, int lda,
                       const float *b, int ldb, float beta, float *c, int ldc) {
  const uint64_t t0 = moe_time_ns();
  moe_gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  *ms += moe_time_ms_since(t0);
}

static moe_status check_finite(moe_ctx *ctx, const char *name, const float *x, int tokens,
                               int cols) {
  moe_status st = MOE_STATUS_OK;
  const ptrdiff_t bad = moe_find_nonfinite(x, (size_t)tokens * (size_t)cols);
  MOE_FAIL_IF(ctx, bad >= 0, MOE_STATUS_INVALID_ARG,
              "%s has a non-finite value (%g) at token %td, column %td", name, (double)x[bad],
              bad / cols, bad % cols);
done:
  return st;
}

// Gate: logits, probabilities, top-k choices and weights, routing plan, aux losses.
static moe_status gate_forward(moe_layer *L, const float *x, int T) {
  moe_status st = MOE_STATUS_OK;
  const moe_layer_config *c = &L->cfg;
  const int M = c->model_dim, E = c->num_experts, K = c->top_k;
  moe_route *r = &L->route;
  timed_gemm(&L->fwd_timing.gate_gemm_ms, 0, 0, T, E, M, x, M, L->t.wg, E, 0.0f, L->logits, E);
  L->fwd_timing.gate_flops = 2.0 * T * M * E;
  moe_softmax_forward(L->probs, L->logits, T, E);
  moe_logsumexp_forward(L->lse, L->logits, T, E);
  if (T > 0) moe_topk_forward(r->expert, L->topk_p, L->probs, T, E, K);
  for (int t = 0; t < T; t++) {
    const float *p = L->topk_p + (size_t)t * K;
    float *w = r->weight + (size_t)t * K;
    float sum = 0.0f;
    for (int k = 0; k < K; k++) sum += p[k];
    for (int k = 0; k < K; k++) w[k] = c->renormalize ? p[k] / sum : p[k];
  }
  MOE_TRY(moe_route_assign(L->ctx, r, T, moe_layer_capacity(c, T)));
  // aux = E * sum_e f_e * P_e; z = mean_t lse_t^2 (docs/moe-layer.md step 7)
  double aux = 0.0, z = 0.0;
  if (T > 0) {
    for (int e = 0; e < E; e++) {
      double pe = 0.0;
      for (int t = 0; t < T; t++) pe += L->probs[(size_t)t * E + e];
      aux += ((double)r->count_all[e] / ((double)T * K)) * (pe / T);
    }
    aux *= E;
    for (int t = 0; t < T; t++) z += (double)L->lse[t] * L->lse[t];
    z /= T;
  }
  L->stats.aux_loss = (float)aux;
  L->stats.z_loss = (float)z;
done:
  return st;
}

static void experts_forward(moe_layer *L) {
  const moe_layer_config *c = &L->cfg;
  const size_t M = (size_t)c->model_dim, H = (size_t)c->hidden_dim;
  const moe_route *r = &L->route;
  moe_layer_timing *tm = &L->fwd_timing;
  for (int e = 0; e < c->num_experts; e++) {
    const int n = r->count[e];
    if (n == 0) continue;
    const size_t off = (size_t)r->offset[e];
    const float *w1 = L->t.w1 + (size_t)e * M * H, *b1 = L->t.b1 + (size_t)e * H;
    const float *w2 = L->t.w2 + (size_t)e * H * M, *b2 = L->t.b2 + (size_t)e * M;
    float *xe = L->xe + off * M, *pre = L->pre + off * H, *h = L->h + off * H;
    float *ye = L->ye + off * M;
    // pre = xe w1 + b1; h = act(pre); ye = h w2 + b2
    timed_gemm(&tm->expert_gemm_ms, 0, 0, n, (int)H, (int)M, xe, (int)M, w1, (int)H, 0.0f, pre,
               (int)H);
    uint64_t t0 = moe_time_ns();
    moe_bias_add_forward(pre, b1, n, (int)H);
    if (c->act == MOE_ACT_GELU) {
      moe_gelu_forward(h, pre, (size_t)n * H);
    } else {
      moe_relu_forward(h, pre, (size_t)n * H);
    }
    tm->expert_other_ms += moe_time_ms_since(t0);
    timed_gemm(&tm->expert_gemm_ms, 0, 0, n, (int)M, (int)H, h, (int)H, w2, (int)M, 0.0f, ye,
               (int)M);
    t0 = moe_time_ns();
    moe_bias_add_forward(ye, b2, n, (int)M);
    tm->expert_other_ms += moe_time_ms_since(t0);
    tm->expert_flops += 4.0 * n * (double)M * (double)H;
  }
}

moe_status moe_layer_forward(moe_layer *L, const float *x, int tokens, float *y,
                             moe_layer_stats *stats) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L ? L->ctx : NULL;
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_INVALID_ARG, "layer must not be NULL");
  const moe_layer_config *c = &L->cfg;
  const int M = c->model_dim, K = c->top_k;
  L->have_forward = 0;
  MOE_FAIL_IF(ctx, tokens < 0 || tokens > c->tokens, MOE_STATUS_INVALID_ARG,
              "tokens (%d) must be in [0, %d] (the layer's configured tokens)", tokens, c->tokens);
  MOE_FAIL_IF(ctx, tokens > 0 && (!x || !y), MOE_STATUS_INVALID_ARG, "x and y must not be NULL");
  {
    // Backward reads x again, so y must not overwrite it.
    const size_t bytes = (size_t)tokens * (size_t)M * sizeof(float);
    const uintptr_t xb = (uintptr_t)x, yb = (uintptr_t)y;
    MOE_FAIL_IF(ctx, tokens > 0 && xb < yb + bytes && yb < xb + bytes, MOE_STATUS_INVALID_ARG,
                "x and y must not overlap (backward needs the input x unchanged)");
  }
  const uint64_t t_start = moe_time_ns();
  if (c->check_finite) MOE_TRY(check_finite(ctx, "input x", x, tokens, M));
  memset(&L->fwd_timing, 0, sizeof L->fwd_timing);
  moe_layer_timing *tm = &L->fwd_timing;

  // step 1: gate and routing plan
  uint64_t t0 = moe_time_ns();
  MOE_TRY(gate_forward(L, x, tokens));
  tm->gate_ms = moe_time_ms_since(t0);

  // step 2: dispatch rows into expert order
  t0 = moe_time_ns();
  const moe_route *r = &L->route;
  for (int row = 0; row < r->rows; row++) {
    memcpy(L->xe + (size_t)row * M, x + (size_t)r->row_token[row] * M, (size_t)M * sizeof(float));
  }
  tm->dispatch_ms = moe_time_ms_since(t0);

  // step 3: experts
  experts_forward(L);

  // step 4: combine, choices in order k = 0..K-1; dropped choices add nothing
  t0 = moe_time_ns();
  if (tokens > 0) memset(y, 0, (size_t)tokens * (size_t)M * sizeof(float));
  for (int t = 0; t < tokens; t++) {
    float *yt = y + (size_t)t * M;
    for (int k = 0; k < K; k++) {
      const int s = r->slot[t * K + k];
      if (s < 0) continue;
      const float w = r->weight[t * K + k];
      const float *ye = L->ye + (size_t)(r->offset[r->expert[t * K + k]] + s) * M;
      for (int j = 0; j < M; j++) yt[j] += w * ye[j];
    }
  }
  tm->combine_ms = moe_time_ms_since(t0);
  tm->total_ms = moe_time_ms_since(t_start);

  L->x_last = x;
  L->tokens_last = tokens;
  L->have_forward = 1;
  L->stats.tokens = tokens;
  L->stats.rows = r->rows;
  L->stats.dropped = r->dropped;
  if (stats) *stats = L->stats;
done:
  return st;
}

// ---- backward ----------------------------------------------------------------------

static void experts_backward(moe_layer *L) {
  const moe_layer_config *c = &L->cfg;
  const size_t M = (size_t)c->model_dim, H = (size_t)c->hidden_dim;
  const moe_route *r = &L->route;
  moe_layer_timing *tm = &L->bwd_timing;
  if (r->rows > 0) memset(L->dpre, 0, (size_t)r->rows * H * sizeof(float));
  for (int e = 0; e < c->num_experts; e++) {
    const int n = r->count[e];
    if (n == 0) continue;
    const size_t off = (size_t)r->offset[e];
    const float *w1 = L->t.w1 + (size_t)e * M * H, *w2 = L->t.w2 + (size_t)e * H * M;
    float *dw1 = L->t.dw1 + (size_t)e * M * H, *db1 = L->t.db1 + (size_t)e * H;
    float *dw2 = L->t.dw2 + (size_t)e * H * M, *db2 = L->t.db2 + (size_t)e * M;
    const float *xe = L->xe + off * M, *pre = L->pre + off * H, *h = L->h + off * H;
    float *dye = L->dye + off * M, *dh = L->dh + off * H, *dpre = L->dpre + off * H;
    uint64_t t0 = moe_time_ns();
    moe_bias_add_backward(db2, dye, n, (int)M);
    tm->expert_other_ms += moe_time_ms_since(t0);
    // dw2 += h^T dye; dh = dye w2^T
    timed_gemm(&tm->expert_gemm_ms, 1, 0, (int)H, (int)M, n, h, (int)H, dye, (int)M, 1.0f, dw2,
               (int)M);
    timed_gemm(&tm->expert_gemm_ms, 0, 1, n, (int)H, (int)M, dye, (int)M, w2, (int)M, 0.0f, dh,
               (int)H);
    t0 = moe_time_ns();
    if (c->act == MOE_ACT_GELU) {
      moe_gelu_backward(dpre, dh, pre, (size_t)n * H);
    } else {
      moe_relu_backward(dpre, dh, pre, (size_t)n * H);
    }
    moe_bias_add_backward(db1, dpre, n, (int)H);
    tm->expert_other_ms += moe_time_ms_since(t0);
    // dw1 += xe^T dpre; dxe = dpre w1^T, written over dye (no longer needed)
    timed_gemm(&tm->expert_gemm_ms, 1, 0, (int)M, (int)H, n, xe, (int)M, dpre, (int)H, 1.0f, dw1,
               (int)H);
    timed_gemm(&tm->expert_gemm_ms, 0, 1, n, (int)M, (int)H, dpre, (int)H, w1, (int)H, 0.0f, dye,
               (int)M);
    tm->expert_flops += 8.0 * n * (double)M * (double)H;
  }
}

static void gate_backward(moe_layer *L, float *dx) {
  const moe_layer_config *c = &L->cfg;
  const int T = L->tokens_last, M = c->model_dim, E = c->num_experts, K = c->top_k;
  const moe_route *r = &L->route;
  memset(L->dprobs, 0, (size_t)T * E * sizeof(float));
  // top-k (and renormalisation) backward: dweight -> dprobs
  for (int t = 0; t < T; t++) {
    const float *dw = L->dweight + (size_t)t * K, *w = r->weight + (size_t)t * K;
    const float *p = L->topk_p + (size_t)t * K;
    float *dp = L->dprobs + (size_t)t * E;
    if (c->renormalize) {
      float sum = 0.0f, dot = 0.0f;
      for (int k = 0; k < K; k++) {
        sum += p[k];
        dot += dw[k] * w[k];
      }
      for (int k = 0; k < K; k++) dp[r->expert[t * K + k]] += (dw[k] - dot) / sum;
    } else {
      for (int k = 0; k < K; k++) dp[r->expert[t * K + k]] += dw[k];
    }
  }
  // aux: d/dprobs[t,e] of coef * E * sum_e f_e * mean_t probs[t,e]
  if (c->aux_loss_coef > 0.0f && T > 0) {
    for (int e = 0; e < E; e++) {
      const float g =
          (float)((double)c->aux_loss_coef * E * ((double)r->count_all[e] / ((double)T * K)) / T);
      for (int t = 0; t < T; t++) L->dprobs[(size_t)t * E + e] += g;
    }
  }
  memset(L->dlogits, 0, (size_t)T * E * sizeof(float));
  moe_softmax_backward(L->dlogits, L->dprobs, L->probs, T, E);
  // z-loss: d/dlogits[t,e] of coef * mean_t lse_t^2 = coef * 2/T * lse_t * probs[t,e]
  if (c->z_loss_coef > 0.0f && T > 0) {
    for (int t = 0; t < T; t++) {
      const float g = c->z_loss_coef * 2.0f / (float)T * L->lse[t];
      for (int e = 0; e < E; e++) L->dlogits[(size_t)t * E + e] += g * L->probs[(size_t)t * E + e];
    }
  }
  // dwg += x^T dlogits; dx += dlogits wg^T
  moe_layer_timing *tm = &L->bwd_timing;
  timed_gemm(&tm->gate_gemm_ms, 1, 0, M, E, T, L->x_last, M, L->dlogits, E, 1.0f, L->t.dwg, E);
  timed_gemm(&tm->gate_gemm_ms, 0, 1, T, M, E, L->dlogits, E, L->t.wg, E, 1.0f, dx, M);
  tm->gate_flops = 4.0 * T * M * E;
}

moe_status moe_layer_backward(moe_layer *L, const float *dy, float *dx) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L ? L->ctx : NULL;
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_INVALID_ARG, "layer must not be NULL");
  MOE_FAIL_IF(ctx, !L->have_forward, MOE_STATUS_INVALID_ARG,
              "backward needs a successful forward first");
  const moe_layer_config *c = &L->cfg;
  const int T = L->tokens_last, M = c->model_dim, K = c->top_k;
  MOE_FAIL_IF(ctx, T > 0 && (!dy || !dx), MOE_STATUS_INVALID_ARG, "dy and dx must not be NULL");
  const uint64_t t_start = moe_time_ns();
  if (c->check_finite) MOE_TRY(check_finite(ctx, "gradient dy", dy, T, M));
  memset(&L->bwd_timing, 0, sizeof L->bwd_timing);
  moe_layer_timing *tm = &L->bwd_timing;
  const moe_route *r = &L->route;

  // step 1: combine backward: dye[row] = w * dy[t]; dweight[t,k] = dy[t] . ye[row]
  uint64_t t0 = moe_time_ns();
  memset(L->dweight, 0, (size_t)T * K * sizeof(float));
  for (int row = 0; row < r->rows; row++) {
    const int t = r->row_token[row], k = r->row_choice[row];
    const float w = r->weight[t * K + k];
    const float *dyt = dy + (size_t)t * M, *ye = L->ye + (size_t)row * M;
    float *dye = L->dye + (size_t)row * M;
    double dot = 0.0;
    for (int j = 0; j < M; j++) {
      dye[j] = w * dyt[j];
      dot += (double)dyt[j] * ye[j];
    }
    L->dweight[t * K + k] = (float)dot;
  }
  tm->combine_ms = moe_time_ms_since(t0);

  // step 2: experts backward (leaves dxe in L->dye)
  experts_backward(L);

  // step 3: dispatch backward: scatter-add row grads into token grads
  t0 = moe_time_ns();
  for (int row = 0; row < r->rows; row++) {
    float *dxt = dx + (size_t)r->row_token[row] * M;
    const float *dxe = L->dye + (size_t)row * M;
    for (int j = 0; j < M; j++) dxt[j] += dxe[j];
  }
  tm->dispatch_ms = moe_time_ms_since(t0);

  // step 4: gate backward
  t0 = moe_time_ns();
  gate_backward(L, dx);
  tm->gate_ms = moe_time_ms_since(t0);
  tm->total_ms = moe_time_ms_since(t_start);
done:
  return st;
}
