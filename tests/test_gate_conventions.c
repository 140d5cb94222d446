// The gate conventions (moe_layer_config.gate_convention) against their
// documented formulas, computed here in double from the layer's own
// parameters and routing:
//   libmoe / Megatron-Core: aux = E sum_e (choices of e / (T K)) * mean_t p_te;
//     renormalised weights p_k / sum_k p_k over the top K, before dropping;
//   DeepSpeed / GShard: aux = E sum_e (tokens whose first choice is e / T) *
//     mean_t p_te; renormalised weights p_k / sum over the kept choices, 0 for
//     a dropped one.
// Then the backward of each against central finite differences of
// L = sum(y . dy) + aux_coef * aux in the gate weights (routing held fixed by a
// small step), and the JSON key round trip.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe/moe.h"
#include "testutil.h"

enum { T = 48, M = 12, H = 10, E = 4, K = 2 };

static moe_ctx *g_ctx;

typedef struct {
  moe_layer *layer;
  const float *x, *dy;
  float *y;
  float aux_coef;
} fd_state;

// L = sum(y . dy) + aux_coef * aux, with the layer's current parameters.
static double loss_of(void *user) {
  fd_state *s = user;
  moe_layer_stats st;
  moe_layer_forward(s->layer, s->x, T, s->y, &st);
  double l = 0.0;
  for (size_t i = 0; i < (size_t)T * M; i++) l += (double)s->y[i] * s->dy[i];
  return l + (double)s->aux_coef * st.aux_loss;
}

// probs (T, E) in double from x and wg.
static void reference_probs(const float *x, const float *wg, double *probs) {
  for (int t = 0; t < T; t++) {
    double lg[E], mx = -INFINITY, sum = 0.0;
    for (int e = 0; e < E; e++) {
      lg[e] = 0.0;
      for (int m = 0; m < M; m++) lg[e] += (double)x[t * M + m] * wg[m * E + e];
      mx = fmax(mx, lg[e]);
    }
    for (int e = 0; e < E; e++) sum += exp(lg[e] - mx);
    for (int e = 0; e < E; e++) probs[t * E + e] = exp(lg[e] - mx) / sum;
  }
}

static void check_convention(moe_gate_convention gc) {
  const char *name = moe_gate_convention_name(gc);
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.tokens = T;
  cfg.model_dim = M;
  cfg.hidden_dim = H;
  cfg.num_experts = E;
  cfg.top_k = K;
  cfg.capacity_factor = 0.6;  // C = ceil(0.6 * 2 * 48 / 4) = 15: some choices dropped
  cfg.renormalize = 1;
  cfg.aux_loss_coef = 0.3f;
  cfg.gate_convention = (int)gc;
  snprintf(cfg.expert, sizeof cfg.expert, "ffn-ref");
  moe_layer *layer = NULL;
  TU_CHECK(moe_layer_create(g_ctx, &cfg, &layer) == MOE_STATUS_OK, "%s: create: %s", name,
           moe_ctx_error(g_ctx));
  if (!layer) return;
  moe_layer_init_params(layer, 9);
  moe_layer_tensors tn = moe_layer_get_tensors(layer);
  for (int i = 0; i < M * E; i++) tn.wg[i] *= 6.0f;  // a peaked gate: uneven loads
  float *x = tu_filled((size_t)T * M, 31, -1.0f, 1.0f);
  float *dy = tu_filled((size_t)T * M, 32, -1.0f, 1.0f);
  float *y = tu_filled((size_t)T * M, 33, 0.0f, 0.0f);
  float *dx = tu_filled((size_t)T * M, 34, 0.0f, 0.0f);
  moe_layer_stats st;
  TU_CHECK(moe_layer_forward(layer, x, T, y, &st) == MOE_STATUS_OK, "%s: forward", name);
  TU_CHECK(st.dropped > 0, "%s: the case needs dropped choices (got %d)", name, st.dropped);
  const moe_route *r = moe_layer_get_route(layer);
  double probs[T * E], pe[E] = {0}, fe[E] = {0};
  reference_probs(x, tn.wg, probs);
  for (int t = 0; t < T; t++)
    for (int e = 0; e < E; e++) pe[e] += probs[t * E + e] / T;
  for (int t = 0; t < T; t++) {
    for (int k = 0; k < (gc == MOE_GATE_DEEPSPEED ? 1 : K); k++) fe[r->expert[t * K + k]] += 1.0;
  }
  double aux = 0.0;
  for (int e = 0; e < E; e++) aux += fe[e] / (gc == MOE_GATE_DEEPSPEED ? T : T * K) * pe[e];
  aux *= E;
  TU_CHECK(fabs(st.aux_loss - aux) <= 1e-5 * fabs(aux), "%s: aux %.7f, formula %.7f", name,
           (double)st.aux_loss, aux);
  int weights_ok = 1, worst_t = -1;
  for (int t = 0; t < T; t++) {
    double sum = 0.0;
    for (int k = 0; k < K; k++) {
      const int kept = r->slot[t * K + k] >= 0;
      if (gc == MOE_GATE_LIBMOE || kept) sum += probs[t * E + r->expert[t * K + k]];
    }
    for (int k = 0; k < K; k++) {
      const int kept = r->slot[t * K + k] >= 0;
      double want = probs[t * E + r->expert[t * K + k]] / sum;
      if (gc == MOE_GATE_DEEPSPEED && !kept) want = 0.0;
      if (!(fabs(r->weight[t * K + k] - want) <= 1e-5)) weights_ok = 0, worst_t = t;
    }
  }
  TU_CHECK(weights_ok, "%s: the gate weights of token %d differ from the formula", name, worst_t);
  // backward against finite differences (dwg), routing fixed by a small step
  moe_layer_zero_grad(layer);
  TU_CHECK(moe_layer_forward(layer, x, T, y, &st) == MOE_STATUS_OK, "%s: forward", name);
  TU_CHECK(moe_layer_backward(layer, dy, dx) == MOE_STATUS_OK, "%s: backward", name);
  float *dwg = tu_copy_of(tn.dwg, (size_t)M * E);
  fd_state s = {layer, x, dy, y, cfg.aux_loss_coef};
  char label[64];
  snprintf(label, sizeof label, "%s dwg", name);
  tu_fd_check(label, loss_of, &s, tn.wg, dwg, (size_t)M * E, 1e-3f, 2e-3, 2e-2);
  moe_layer_destroy(layer);
}

int main(void) {
  moe_log_set_level(MOE_LOG_ERROR);
  moe_ctx_create(&g_ctx);
  check_convention(MOE_GATE_LIBMOE);
  check_convention(MOE_GATE_DEEPSPEED);
  // JSON: the key in and out; the default is not written (configs stay as before)
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  char buf[1024];
  TU_CHECK(moe_layer_config_to_json(g_ctx, &cfg, buf, sizeof buf) == MOE_STATUS_OK &&
               !strstr(buf, "gate_convention"),
           "the default convention is not written: %s", buf);
  TU_CHECK(moe_layer_config_from_json(g_ctx, "{\"gate_convention\": \"deepspeed\"}", &cfg) ==
                   MOE_STATUS_OK &&
               cfg.gate_convention == MOE_GATE_DEEPSPEED,
           "deepspeed parsed: %s", moe_ctx_error(g_ctx));
  moe_layer_config back;
  moe_layer_config_default(&back);
  TU_CHECK(moe_layer_config_to_json(g_ctx, &cfg, buf, sizeof buf) == MOE_STATUS_OK &&
               moe_layer_config_from_json(g_ctx, buf, &back) == MOE_STATUS_OK &&
               back.gate_convention == MOE_GATE_DEEPSPEED,
           "round trip: %s", buf);
  TU_CHECK(moe_layer_config_from_json(g_ctx, "{\"gate_convention\": \"megatron\"}", &cfg) ==
                   MOE_STATUS_OK &&
               cfg.gate_convention == MOE_GATE_LIBMOE,
           "megatron is libmoe's convention");
  TU_CHECK(moe_layer_config_from_json(g_ctx, "{\"gate_convention\": \"tutel\"}", &cfg) ==
                   MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "deepspeed"),
           "unknown convention: %s", moe_ctx_error(g_ctx));
  cfg.gate_convention = 7;
  TU_CHECK(moe_layer_config_validate(g_ctx, &cfg) == MOE_STATUS_INVALID_ARG, "validate range");
  moe_ctx_destroy(g_ctx);
  tu_free_all();
  return tu_finish("test_gate_conventions");
}
